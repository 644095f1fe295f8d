// The benchmark's vendor in its own process: `GET /v1/charges` answers a fixed Stripe-shaped
// list, keep-alive, as fast as Node's http server goes. Prints `listening PORT` once bound.
const http = require("http");
const body = JSON.stringify({
  object: "list",
  has_more: false,
  data: [
    { id: "ch_1", object: "charge", amount: 1000, currency: "usd", status: "succeeded" },
    { id: "ch_2", object: "charge", amount: 2000, currency: "usd", status: "succeeded" },
  ],
});
const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url.startsWith("/v1/charges")) {
    res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    res.end(body);
  } else {
    res.writeHead(404);
    res.end();
  }
});
server.keepAliveTimeout = 60000;
server.listen(0, "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});
