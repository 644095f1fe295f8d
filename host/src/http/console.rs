//! The operator console: server-rendered pages of what the gateway is doing.
//!
//! A workspace owner signs in with the owner token (the inbox's credential) and sees only
//! their workspace: calls and outcomes per minute and latency over the last hour, pending
//! approvals (linking to the inbox), and receipts with filters and each one's full record.
//! The admin token sees every workspace, and the pages only it may see: the connectors (version,
//! digest, signer, each tool's EffectSpec) and the keys (names, scopes, globs; never hashes).
//!
//! The same rules as the inbox: a sealed session cookie (`HttpOnly`, `SameSite=Strict`, path
//! `/console`) that dies with the credential it was opened with; sign-in and sign-out are
//! same-origin form posts (sign-out carries the session's CSRF token); pages are served with
//! the CSP that forbids scripts and framing, and use no external asset (charts are inline SVG).

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::page::{age, constant_time_eq, cookie, escape, html, random_hex, redirect};
use crate::approvals::TicketStatus;
use crate::clock::now_ms;
use crate::gateway::Gateway;
use crate::store::{OutcomeClass, Receipt, StoreError};

const COOKIE: &str = "obol_console";
const SESSION_PREFIX: &str = "ocs1";
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// The most receipts one page lists, and the most the charts and filters read (the newest;
/// a page says when the last hour held more).
const LISTED: usize = 200;
const CHARTED: usize = 2000;
const MINUTE_MS: u64 = 60_000;

/// Who is looking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "as", rename_all = "snake_case")]
enum Viewer {
    Owner { workspace: String },
    Admin,
}

/// A console session: a sealed cookie, like the inbox's, carrying a digest of the credential
/// it was opened with.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ConsoleSession {
    viewer: Viewer,
    csrf: String,
    #[serde(rename = "exp")]
    until_ms: u64,
    cred: String,
}

impl ConsoleSession {
    fn open(gateway: &Gateway, viewer: Viewer) -> Option<String> {
        let session = ConsoleSession {
            cred: credential(gateway, &viewer)?,
            viewer,
            csrf: random_hex(),
            until_ms: now_ms() + SESSION_TTL.as_millis() as u64,
        };
        Some(gateway.approvals.keyring.seal(SESSION_PREFIX, &session))
    }

    fn of(gateway: &Gateway, headers: &HeaderMap) -> Option<ConsoleSession> {
        let sealed = cookie(headers, COOKIE)?;
        let session: ConsoleSession = gateway
            .approvals
            .keyring
            .open(SESSION_PREFIX, sealed)
            .ok()?;
        let current = credential(gateway, &session.viewer)?;
        (session.until_ms > now_ms()
            && constant_time_eq(current.as_bytes(), session.cred.as_bytes()))
        .then_some(session)
    }

    /// The workspaces this viewer may see.
    fn workspaces(&self, gateway: &Gateway) -> Vec<String> {
        match &self.viewer {
            Viewer::Owner { workspace } => vec![workspace.clone()],
            Viewer::Admin => gateway
                .config_workspaces()
                .iter()
                .map(|w| w.id.clone())
                .collect(),
        }
    }

    /// The workspace a page shows: the one asked for, if this viewer may see it.
    fn workspace(&self, gateway: &Gateway, asked: Option<&str>) -> Option<String> {
        let visible = self.workspaces(gateway);
        match asked {
            Some(asked) => visible.into_iter().find(|w| w == asked),
            None => visible.into_iter().next(),
        }
    }
}

/// A digest of the credential behind a viewer (never the credential or its hash): the
/// session ends when it changes.
fn credential(gateway: &Gateway, viewer: &Viewer) -> Option<String> {
    match viewer {
        Viewer::Owner { workspace } => gateway.approvals.owners.session_digest(workspace),
        Viewer::Admin => {
            use sha2::Digest;
            let admin = gateway.admin?;
            let digest = sha2::Sha256::digest(format!("obol console admin\0{admin}").as_bytes());
            Some(hex::encode(&digest[..16]))
        }
    }
}

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/console", get(overview))
        .route("/console/login", post(login))
        .route("/console/logout", post(logout))
        .route("/console/receipts", get(receipts))
        .route("/console/receipts/{id}", get(receipt))
        .route("/console/connectors", get(connectors))
        .route("/console/keys", get(keys))
        .with_state(gateway)
}

/// The signed-in viewer, or the page to answer instead (sign-in, or a foreign host).
fn viewer(gateway: &Gateway, headers: &HeaderMap) -> Result<ConsoleSession, Box<Response>> {
    if !gateway.host_allowed(headers) {
        return Err(Box::new(page(
            StatusCode::MISDIRECTED_REQUEST,
            None,
            "Console",
            "<p>This gateway does not answer to that host name; use its public URL.</p>",
        )));
    }
    ConsoleSession::of(gateway, headers)
        .ok_or_else(|| Box::new(page(StatusCode::OK, None, "Sign in", &login_form(None))))
}

/// The signed-in viewer and the workspace a page of theirs shows (the one asked for, or
/// their first); a workspace they may not see is not found.
fn viewing(
    gateway: &Gateway,
    headers: &HeaderMap,
    asked: Option<&str>,
) -> Result<(ConsoleSession, String), Box<Response>> {
    let session = viewer(gateway, headers)?;
    match session.workspace(gateway, asked) {
        Some(workspace) => Ok((session, workspace)),
        None => Err(Box::new(not_yours(&session))),
    }
}

#[derive(Deserialize)]
struct WorkspaceQuery {
    workspace: Option<String>,
}

async fn overview(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Query(query): Query<WorkspaceQuery>,
) -> Response {
    let (session, workspace) = match viewing(&gateway, &headers, query.workspace.as_deref()) {
        Ok(viewing) => viewing,
        Err(answer) => return *answer,
    };
    let store = &gateway.services.store;
    let (receipts, tickets) = match (
        store.receipts(&workspace, CHARTED).await,
        store.tickets(&workspace, 50).await,
    ) {
        (Ok(receipts), Ok(tickets)) => (receipts, tickets),
        (Err(cause), _) | (_, Err(cause)) => return unavailable(&session, &cause),
    };
    let now = now_ms();
    let minutes = per_minute(&receipts, now);
    let total: usize = minutes.iter().map(Minute::calls).sum();
    let mut body = workspace_picker(&session, &gateway, &workspace, "/console");
    body.push_str(&truncated(&receipts, now));
    let _ = write!(
        body,
        "<h2>Last hour in {ws}</h2><p id=\"calls-total\">{total} calls</p>\
         <h3>Calls per minute, by outcome</h3>{calls}\
         <h3>Latency per minute (median, ms)</h3>{latency}",
        ws = escape(&workspace),
        calls = calls_chart(&minutes),
        latency = latency_chart(&minutes),
    );
    let pending: Vec<_> = tickets
        .iter()
        .filter(|t| t.status == TicketStatus::Pending && !t.expired(now))
        .collect();
    let _ = write!(body, "<h2>Pending approvals ({})</h2>", pending.len());
    if pending.is_empty() {
        body.push_str("<p>None.</p>");
    } else {
        body.push_str(
            "<table id=\"pending\"><tr><th>tool</th><th>key</th><th>age</th><th></th></tr>",
        );
        for ticket in pending {
            let id = ticket.id.as_str();
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td><a href=\"/inbox/{id}\">decide in the inbox</a></td></tr>",
                escape(&ticket.tool),
                escape(&ticket.key_name),
                age(ticket.created_at_ms, now),
            );
        }
        body.push_str("</table>");
    }
    page(StatusCode::OK, Some(&session), "Overview", &body)
}

#[derive(Deserialize)]
struct ReceiptFilter {
    workspace: Option<String>,
    #[serde(default)]
    key: String,
    #[serde(default)]
    tool: String,
    #[serde(default)]
    outcome: String,
    /// Only the last this many minutes (0 or absent: no limit).
    #[serde(default)]
    since_minutes: String,
}

async fn receipts(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Query(filter): Query<ReceiptFilter>,
) -> Response {
    let (session, workspace) = match viewing(&gateway, &headers, filter.workspace.as_deref()) {
        Ok(viewing) => viewing,
        Err(answer) => return *answer,
    };
    let listed = match gateway.services.store.receipts(&workspace, CHARTED).await {
        Ok(listed) => listed,
        Err(cause) => return unavailable(&session, &cause),
    };
    let now = now_ms();
    let since = filter
        .since_minutes
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|m| *m > 0)
        .map(|m| now.saturating_sub(m.saturating_mul(MINUTE_MS)));
    let shown: Vec<&Receipt> = listed
        .iter()
        .filter(|r| filter.key.is_empty() || r.key_name.as_deref() == Some(filter.key.trim()))
        .filter(|r| filter.tool.is_empty() || r.tool.contains(filter.tool.trim()))
        .filter(|r| filter.outcome.is_empty() || outcome_label(r) == filter.outcome)
        .filter(|r| since.is_none_or(|since| r.created_at_ms >= since))
        .take(LISTED)
        .collect();
    let mut body = workspace_picker(&session, &gateway, &workspace, "/console/receipts");
    body.push_str(&truncated(&listed, now));
    let selected = |value: &str| match filter.outcome == value {
        true => " selected",
        false => "",
    };
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/console/receipts\" id=\"filters\">\
         <input type=\"hidden\" name=\"workspace\" value=\"{ws}\">\
         <label>key <input name=\"key\" id=\"filter-key\" value=\"{key}\"></label> \
         <label>tool <input name=\"tool\" id=\"filter-tool\" value=\"{tool}\"></label> \
         <label>outcome <select name=\"outcome\" id=\"filter-outcome\"><option value=\"\">any</option>\
         <option{a}>accepted</option><option{r}>definitely_rejected</option><option{u}>unknown</option><option{x}>refused</option></select></label> \
         <label>last <input name=\"since_minutes\" id=\"filter-since\" size=\"4\" value=\"{since}\"> min</label> \
         <button type=\"submit\" id=\"filter\">Filter</button></form>\
         <p id=\"receipt-count\">{n} receipts</p>\
         <table id=\"receipts\"><tr><th>when</th><th>tool</th><th>key</th><th>outcome</th><th>attempts</th><th>ms</th></tr>",
        ws = escape(&workspace),
        key = escape(&filter.key),
        tool = escape(&filter.tool),
        since = escape(&filter.since_minutes),
        a = selected("accepted"),
        r = selected("definitely_rejected"),
        u = selected("unknown"),
        x = selected("refused"),
        n = shown.len(),
    );
    for r in &shown {
        let _ = write!(
            body,
            "<tr class=\"receipt\"><td>{age}</td><td><a class=\"open\" href=\"/console/receipts/{id}?workspace={ws}\">{tool}</a></td>\
             <td>{key}</td><td class=\"outcome\">{outcome}</td><td>{attempts}</td><td>{ms}</td></tr>",
            age = age(r.created_at_ms, now),
            id = escape(&r.id),
            ws = escape(&workspace),
            tool = escape(&r.tool),
            key = escape(r.key_name.as_deref().unwrap_or("")),
            outcome = outcome_label(r),
            attempts = r.attempt_count,
            ms = r.finalized_at_ms.saturating_sub(r.created_at_ms),
        );
    }
    body.push_str("</table>");
    page(StatusCode::OK, Some(&session), "Receipts", &body)
}

async fn receipt(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(query): Query<WorkspaceQuery>,
) -> Response {
    let (session, workspace) = match viewing(&gateway, &headers, query.workspace.as_deref()) {
        Ok(viewing) => viewing,
        Err(answer) => return *answer,
    };
    match gateway.services.store.receipt(&workspace, &id).await {
        Ok(Some(receipt)) => {
            let record = serde_json::to_string_pretty(&receipt).unwrap_or_default();
            let body = format!(
                "<h2>Receipt <code id=\"receipt-id\">{}</code></h2><pre id=\"receipt\">{}</pre>\
                 <p><a href=\"/console/receipts?workspace={}\">All receipts</a></p>",
                escape(&receipt.id),
                escape(&record),
                escape(&workspace),
            );
            page(StatusCode::OK, Some(&session), "Receipt", &body)
        }
        Ok(None) => page(
            StatusCode::NOT_FOUND,
            Some(&session),
            "Receipt",
            "<p>No such receipt in this workspace.</p>",
        ),
        Err(cause) => unavailable(&session, &cause),
    }
}

async fn connectors(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let session = match viewer(&gateway, &headers) {
        Ok(session) => session,
        Err(answer) => return *answer,
    };
    if session.viewer != Viewer::Admin {
        return admin_only(&session);
    }
    let catalog = gateway.catalog();
    let mut body = String::from("<h2>Connectors</h2>");
    for connector in catalog.connectors.values() {
        let m = &connector.manifest;
        let signer = match &connector.provenance {
            crate::catalog::trust::Provenance::Signed { publisher, key_id } => {
                format!("signed by {} (key {})", escape(publisher), escape(key_id))
            }
            crate::catalog::trust::Provenance::Pinned => "pinned by sha256".into(),
            crate::catalog::trust::Provenance::Bundled => "bundled".into(),
            crate::catalog::trust::Provenance::Unchecked => {
                "unchecked (no [connectors.trust])".into()
            }
        };
        let _ = write!(
            body,
            "<section class=\"connector\" id=\"connector-{name}\"><h3>{name} {version}</h3>\
             <p>sha256 <code>{digest}</code> · {contract} · {signer}</p>\
             <table><tr><th>tool</th><th>route</th><th>destructive</th><th>statuses</th><th>propagation</th><th>output schema</th></tr>",
            name = escape(m.name.as_str()),
            version = escape(&m.version),
            digest = escape(&connector.guest.digest),
            contract = connector.guest.contract.label(),
        );
        for tool in &m.tools {
            let e = &tool.effect;
            let statuses: Vec<String> = e
                .statuses
                .classes()
                .into_iter()
                .map(|(class, ranges)| format!("{class} {}", ranges.join(", ")))
                .collect();
            let _ = write!(
                body,
                "<tr><td>{}.{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(m.name.as_str()),
                escape(&tool.upstream_name),
                e.route.label(),
                e.destructive,
                escape(&statuses.join("; ")),
                escape(&String::from(crate::store::PinnedBinding::from(
                    &e.propagation
                ))),
                e.output_schema.is_some(),
            );
        }
        body.push_str("</table></section>");
    }
    page(StatusCode::OK, Some(&session), "Connectors", &body)
}

async fn keys(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let session = match viewer(&gateway, &headers) {
        Ok(session) => session,
        Err(answer) => return *answer,
    };
    if session.viewer != Viewer::Admin {
        return admin_only(&session);
    }
    let keys = match crate::admin::keys_listing(&gateway).await {
        Ok(keys) => keys,
        Err(cause) => return unavailable(&session, &cause),
    };
    let list = |value: &serde_json::Value| {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let text = |value: &serde_json::Value| value.as_str().unwrap_or("").to_owned();
    let mut body = String::from(
        "<h2>Keys</h2><table id=\"keys\"><tr><th>name</th><th>workspace</th><th>environment</th><th>scopes</th><th>allowed tools</th><th>from</th><th>revoked</th></tr>",
    );
    for key in &keys {
        let _ = write!(
            body,
            "<tr class=\"key\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&text(&key["name"])),
            escape(&text(&key["workspace"])),
            escape(&text(&key["environment"])),
            escape(&list(&key["scopes"])),
            escape(&list(&key["allowed_tools"])),
            escape(&text(&key["source"])),
            match key["revoked_at_ms"].is_u64() {
                true => "revoked",
                false => "",
            },
        );
    }
    body.push_str("</table>");
    page(StatusCode::OK, Some(&session), "Keys", &body)
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if !gateway.host_allowed(&headers) || !gateway.same_origin(&headers) {
        return page(
            StatusCode::FORBIDDEN,
            None,
            "Sign in",
            "<p>Cross-site sign-in refused.</p>",
        );
    }
    let token = form.token.trim();
    let viewer = match gateway.approvals.owners.workspace(token) {
        Some(workspace) => Some(Viewer::Owner {
            workspace: workspace.to_owned(),
        }),
        None => gateway
            .admin
            .filter(|admin| *admin == crate::policy::KeyHash::of_token(token))
            .map(|_| Viewer::Admin),
    };
    let Some(sealed) = viewer.and_then(|viewer| ConsoleSession::open(&gateway, viewer)) else {
        return page(
            StatusCode::UNAUTHORIZED,
            None,
            "Sign in",
            &login_form(Some(
                "That token is neither a workspace owner's nor the admin's.",
            )),
        );
    };
    tracing::info!("signed in to the console");
    let secure = match gateway.approvals.public_url.starts_with("https://") {
        true => "; Secure",
        false => "",
    };
    let mut response = redirect("/console");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{COOKIE}={sealed}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={}{secure}",
            SESSION_TTL.as_secs()
        ))
        .expect("ASCII"),
    );
    response
}

#[derive(Deserialize)]
struct LogoutForm {
    csrf: String,
}

async fn logout(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Response {
    let session = ConsoleSession::of(&gateway, &headers);
    let genuine =
        session.is_some_and(|s| constant_time_eq(form.csrf.as_bytes(), s.csrf.as_bytes()));
    if !gateway.host_allowed(&headers) || !gateway.same_origin(&headers) || !genuine {
        return page(
            StatusCode::FORBIDDEN,
            None,
            "Sign out",
            "<p>This form is stale or did not come from the console.</p>",
        );
    }
    let mut response = redirect("/console");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "obol_console=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0",
        ),
    );
    response
}

/// One minute of the last hour.
#[derive(Debug, Default, Clone)]
struct Minute {
    accepted: usize,
    rejected: usize,
    unknown: usize,
    latencies_ms: Vec<u64>,
}

impl Minute {
    fn calls(&self) -> usize {
        self.accepted + self.rejected + self.unknown
    }

    fn median_ms(&self) -> Option<u64> {
        let mut sorted = self.latencies_ms.clone();
        sorted.sort_unstable();
        sorted.get(sorted.len() / 2).copied()
    }
}

/// The last hour's calls (refusals aside: they never ran), by the minute they were made in;
/// the last entry is the current minute.
fn per_minute(receipts: &[Receipt], now: u64) -> Vec<Minute> {
    let mut minutes = vec![Minute::default(); 60];
    for r in receipts.iter().filter(|r| !r.refusal) {
        let ago = now.saturating_sub(r.created_at_ms) / MINUTE_MS;
        let Some(minute) = (ago < 60).then(|| &mut minutes[59 - ago as usize]) else {
            continue;
        };
        match r.outcome {
            OutcomeClass::Accepted => minute.accepted += 1,
            OutcomeClass::DefinitelyRejected => minute.rejected += 1,
            OutcomeClass::Unknown => minute.unknown += 1,
        }
        minute
            .latencies_ms
            .push(r.finalized_at_ms.saturating_sub(r.created_at_ms));
    }
    minutes
}

const CHART_W: usize = 600;
const CHART_H: usize = 140;
const BAR_W: usize = CHART_W / 60;

/// Stacked bars per minute: accepted, definitely rejected, unknown.
fn calls_chart(minutes: &[Minute]) -> String {
    let most = minutes.iter().map(Minute::calls).max().unwrap_or(0).max(1);
    let mut svg = chart_frame("calls-chart", "Calls per minute by outcome", most, "calls");
    for (i, minute) in minutes.iter().enumerate() {
        let mut top = CHART_H;
        for (class, count, colour) in [
            ("accepted", minute.accepted, "#2f855a"),
            ("definitely_rejected", minute.rejected, "#718096"),
            ("unknown", minute.unknown, "#dd6b20"),
        ] {
            if count == 0 {
                continue;
            }
            let height = (count * CHART_H).div_ceil(most);
            top -= height.min(top);
            let _ = write!(
                svg,
                "<rect class=\"bar {class}\" x=\"{x}\" y=\"{top}\" width=\"{w}\" height=\"{height}\" fill=\"{colour}\"><title>{ago} min ago: {count} {class}</title></rect>",
                x = i * BAR_W,
                w = BAR_W - 1,
                ago = 59 - i,
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// The median latency of each minute that had calls.
fn latency_chart(minutes: &[Minute]) -> String {
    let medians: Vec<Option<u64>> = minutes.iter().map(Minute::median_ms).collect();
    let most = medians.iter().flatten().max().copied().unwrap_or(0).max(1) as usize;
    let mut svg = chart_frame("latency-chart", "Median latency per minute", most, "ms");
    for (i, median) in medians.iter().enumerate() {
        let Some(median) = median else { continue };
        let height = (*median as usize * CHART_H).div_ceil(most).max(1);
        let _ = write!(
            svg,
            "<rect class=\"bar latency\" x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{height}\" fill=\"#3182ce\"><title>{ago} min ago: {median} ms</title></rect>",
            x = i * BAR_W,
            y = CHART_H - height.min(CHART_H),
            w = BAR_W - 1,
            ago = 59 - i,
        );
    }
    svg.push_str("</svg>");
    svg
}

fn chart_frame(id: &str, label: &str, most: usize, unit: &str) -> String {
    format!(
        "<svg id=\"{id}\" role=\"img\" aria-label=\"{label}\" xmlns=\"http://www.w3.org/2000/svg\" \
         width=\"{w}\" height=\"{h}\" viewBox=\"0 -14 {w} {h}\">\
         <text x=\"0\" y=\"-3\" font-size=\"11\">{most} {unit}</text>\
         <line x1=\"0\" y1=\"{CHART_H}\" x2=\"{CHART_W}\" y2=\"{CHART_H}\" stroke=\"#999\"/>\
         <text x=\"0\" y=\"{label_y}\" font-size=\"11\">-60 min</text>\
         <text x=\"{now_x}\" y=\"{label_y}\" font-size=\"11\">now</text>",
        w = CHART_W,
        h = CHART_H + 30,
        label_y = CHART_H + 13,
        now_x = CHART_W - 24,
    )
}

/// `accepted`, `definitely_rejected`, `unknown`, or `refused` for an `Unknown tool` receipt.
fn outcome_label(receipt: &Receipt) -> &'static str {
    if receipt.refusal {
        return "refused";
    }
    match receipt.outcome {
        OutcomeClass::Accepted => "accepted",
        OutcomeClass::DefinitelyRejected => "definitely_rejected",
        OutcomeClass::Unknown => "unknown",
    }
}

/// For the admin, links to each workspace's view of `path`; an owner has one.
fn workspace_picker(
    session: &ConsoleSession,
    gateway: &Gateway,
    current: &str,
    path: &str,
) -> String {
    if session.viewer != Viewer::Admin {
        return String::new();
    }
    let links: Vec<String> = session
        .workspaces(gateway)
        .iter()
        .map(|w| match w == current {
            true => format!("<strong>{}</strong>", escape(w)),
            false => format!("<a href=\"{path}?workspace={0}\">{0}</a>", escape(w)),
        })
        .collect();
    format!("<p id=\"workspaces\">Workspace: {}</p>", links.join(" · "))
}

/// A note when the receipts read (the newest [`CHARTED`]) do not reach back an hour: the
/// charts and filters then cover less than they say.
fn truncated(receipts: &[Receipt], now: u64) -> String {
    match receipts.last() {
        Some(oldest)
            if receipts.len() >= CHARTED
                && oldest.created_at_ms > now.saturating_sub(60 * MINUTE_MS) =>
        {
            format!(
                "<p id=\"truncated\" role=\"note\">Only the newest {CHARTED} receipts are read: they reach back {}.</p>",
                age(oldest.created_at_ms, now)
            )
        }
        _ => String::new(),
    }
}

fn not_yours(session: &ConsoleSession) -> Response {
    page(
        StatusCode::NOT_FOUND,
        Some(session),
        "Not found",
        "<p>No such workspace.</p>",
    )
}

fn admin_only(session: &ConsoleSession) -> Response {
    page(
        StatusCode::FORBIDDEN,
        Some(session),
        "Admin only",
        "<p id=\"admin-only\">This page is for the gateway's admin token.</p>",
    )
}

fn unavailable(session: &ConsoleSession, cause: &StoreError) -> Response {
    tracing::warn!("console: {cause}");
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        Some(session),
        "Unavailable",
        "<p>The state store is unavailable; try again.</p>",
    )
}

fn login_form(problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p id=\"problem\" role=\"alert\">{}</p>", escape(p)))
        .unwrap_or_default();
    format!(
        "{problem}<form method=\"post\" action=\"/console/login\">\
         <label>Owner or admin token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"off\" required></label>\
         <button type=\"submit\" id=\"sign-in\">Sign in</button></form>"
    )
}

/// A console page: navigation for the viewer, then `body`.
fn page(status: StatusCode, session: Option<&ConsoleSession>, title: &str, body: &str) -> Response {
    let nav = match session {
        None => String::new(),
        Some(session) => {
            let (who, admin_pages) = match &session.viewer {
                Viewer::Owner { workspace } => (
                    format!("owner of {}", escape(workspace)),
                    "<a href=\"/inbox\">Inbox</a>".to_owned(),
                ),
                Viewer::Admin => (
                    "admin".to_owned(),
                    "<a href=\"/console/connectors\" id=\"nav-connectors\">Connectors</a> \
                     <a href=\"/console/keys\" id=\"nav-keys\">Keys</a>"
                        .to_owned(),
                ),
            };
            format!(
                "<nav><a href=\"/console\">Overview</a> <a href=\"/console/receipts\" id=\"nav-receipts\">Receipts</a> {admin_pages} \
                 <span id=\"viewer\">{who}</span> <form method=\"post\" action=\"/console/logout\" class=\"inline\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\" id=\"sign-out\">Sign out</button></form></nav>",
                escape(&session.csrf)
            )
        }
    };
    html(
        status,
        &format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Obol · {title}</title>\
             <style>body{{font:15px system-ui,sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem}}\
             nav{{display:flex;gap:1rem;align-items:center;border-bottom:1px solid #ddd;padding-bottom:.5rem}}\
             nav form.inline{{display:inline;margin-left:auto}}table{{border-collapse:collapse;width:100%}}\
             td,th{{text-align:left;padding:.3rem;border-bottom:1px solid #eee;vertical-align:top;font-size:14px}}\
             pre{{background:#f7f7f7;padding:1rem;overflow:auto}}code{{font-size:13px}}svg{{display:block;margin:.5rem 0}}</style></head>\
             <body><h1>Obol console</h1>{nav}{body}</body></html>",
            title = escape(title),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(created_at_ms: u64, took_ms: u64, outcome: OutcomeClass) -> Receipt {
        let mut receipt: Receipt = serde_json::from_value(serde_json::json!({
            "id": "rcp_1", "workspace": "acme", "idempotency_key": "idt_1", "key_source": "minted",
            "tool": "t.x", "connection": "c", "request_hash": "h", "fingerprint": "f",
            "attempt_count": 1, "outcome": "accepted", "vendor_status": 200,
            "evidence": "gateway_observed", "verification": "verified", "note": null,
            "created_at_ms": 0, "finalized_at_ms": 0
        }))
        .unwrap();
        receipt.created_at_ms = created_at_ms;
        receipt.finalized_at_ms = created_at_ms + took_ms;
        receipt.outcome = outcome;
        receipt
    }

    #[test]
    fn the_last_hour_is_counted_by_minute_and_outcome() {
        let now = 10 * 3_600_000;
        let receipts = [
            receipt(now - 10_000, 40, OutcomeClass::Accepted),
            receipt(now - 20_000, 60, OutcomeClass::Accepted),
            receipt(now - 30_000, 900, OutcomeClass::Unknown),
            receipt(
                now - 5 * MINUTE_MS - 1,
                10,
                OutcomeClass::DefinitelyRejected,
            ),
            // Older than an hour: not charted.
            receipt(now - 61 * MINUTE_MS, 10, OutcomeClass::Accepted),
        ];
        let minutes = per_minute(&receipts, now);
        assert_eq!(minutes.len(), 60);
        let current = &minutes[59];
        assert_eq!(
            (current.accepted, current.unknown, current.calls()),
            (2, 1, 3)
        );
        assert_eq!(current.median_ms(), Some(60));
        assert_eq!(minutes[54].rejected, 1);
        assert_eq!(minutes.iter().map(Minute::calls).sum::<usize>(), 4);
        let chart = calls_chart(&minutes);
        assert_eq!(chart.matches("class=\"bar accepted\"").count(), 1);
        assert_eq!(chart.matches("class=\"bar unknown\"").count(), 1);
        assert!(latency_chart(&minutes).contains("60 ms"));
    }
}
