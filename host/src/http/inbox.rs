//! The owner's inbox: a small server-rendered page where the workspace owner approves or
//! denies held calls. The page and its sessions live here, with the other HTTP routes; the
//! tickets it shows and decides, and the owner tokens it admits
//! ([`Owners`](crate::approvals::Owners)), are [`crate::approvals`]' artefacts.
//!
//! Authentication: the owner signs in once with the workspace's owner token (configured as a
//! hash, like keys) and gets a session cookie (`HttpOnly`, `SameSite=Strict`, path `/inbox`).
//! Every decision is a form POST that must carry the session's CSRF token and, when the
//! browser sends one, an `Origin` equal to the page's own; a forged cross-site post has
//! neither the cookie nor the token. Pages are served with a CSP that forbids scripts and
//! framing. Sessions are sealed cookies (`OwnerSession`), so they work on every gateway that
//! shares the signing key and no owner credential is ever stored.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use crate::approvals::{ApprovalDesk, ApprovalId, Decided, Decision, Ticket, TicketStatus};
use crate::clock::now_ms;
use crate::error::ObolError;
use crate::gateway::Gateway;
use crate::store::StoreError;

use super::page::{age, constant_time_eq, cookie, escape, html, random_hex, redirect};

const COOKIE: &str = "obol_owner";
const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// The most tickets one page shows.
/// Rows per inbox page, and how many pages back the inbox goes (older tickets are still
/// reachable by their own `inbox_url`).
const PAGE: usize = 50;
const MAX_PAGES: usize = 20;

/// Owner sessions are sealed cookies (signed with the approval keyring, prefix `ows1`), not
/// server state: any gateway sharing the signing key accepts them, and a restart keeps them.
/// The CSRF token travels inside the `HttpOnly` cookie, so a page on another site can neither
/// read nor forge it. `cred` is the digest of the owner credential it was opened with: the
/// session ends when that credential changes or is removed (or the workspace is gone).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OwnerSession {
    #[serde(rename = "ws")]
    workspace: String,
    csrf: String,
    #[serde(rename = "exp")]
    until_ms: u64,
    #[serde(default)]
    cred: String,
}

const SESSION_PREFIX: &str = "ows1";

impl OwnerSession {
    fn open(approvals: &ApprovalDesk, workspace: &str) -> Option<String> {
        let session = OwnerSession {
            workspace: workspace.to_owned(),
            csrf: random_hex(),
            until_ms: now_ms() + SESSION_TTL.as_millis() as u64,
            cred: approvals.owners.session_digest(workspace)?,
        };
        Some(approvals.keyring.seal(SESSION_PREFIX, &session))
    }

    fn of(approvals: &ApprovalDesk, headers: &HeaderMap) -> Option<OwnerSession> {
        let sealed = cookie(headers, COOKIE)?;
        let session: OwnerSession = approvals.keyring.open(SESSION_PREFIX, sealed).ok()?;
        let current = approvals.owners.session_digest(&session.workspace)?;
        (session.until_ms > now_ms()
            && constant_time_eq(current.as_bytes(), session.cred.as_bytes()))
        .then_some(session)
    }
}

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/inbox", get(inbox))
        .route("/inbox/login", post(login))
        .route("/inbox/logout", post(logout))
        .route("/inbox/{id}", get(inbox_one))
        .route("/inbox/{id}/decide", post(decide))
        .with_state(gateway)
}

#[derive(Deserialize)]
struct PageQuery {
    page: Option<usize>,
}

async fn inbox(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Query(query): Query<PageQuery>,
) -> Response {
    page_for(&gateway, &headers, None, query.page.unwrap_or(0)).await
}

async fn inbox_one(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    page_for(&gateway, &headers, Some(id), 0).await
}

/// A page of the inbox, newest first. A ticket named by the URL (an agent's `inbox_url`) is
/// always on it, at the top when it is not among the page's own rows.
async fn page_for(
    gateway: &Gateway,
    headers: &HeaderMap,
    focus: Option<String>,
    page: usize,
) -> Response {
    if !gateway.host_allowed(headers) {
        return foreign_host();
    }
    let next = match &focus {
        Some(id) if ApprovalId::parse(id).is_some() => format!("/inbox/{id}"),
        _ => "/inbox".to_owned(),
    };
    let Some(session) = OwnerSession::of(&gateway.approvals, headers) else {
        return html(StatusCode::OK, &login_page(&next, None));
    };
    let page = page.min(MAX_PAGES - 1);
    let store = &gateway.services.store;
    // One more than the page holds: whether an older page exists.
    let listed = match store
        .tickets(&session.workspace, (page + 1) * PAGE + 1)
        .await
    {
        Ok(listed) => listed,
        Err(cause) => return unavailable("listing the inbox", &cause),
    };
    let older = listed.len() > (page + 1) * PAGE && page + 1 < MAX_PAGES;
    let mut tickets: Vec<Ticket> = listed.into_iter().skip(page * PAGE).take(PAGE).collect();
    if let Some(id) = focus.as_deref().and_then(ApprovalId::parse)
        && !tickets.iter().any(|t| t.id == id)
    {
        match store.ticket(&id).await {
            Ok(Some(ticket)) if ticket.workspace == session.workspace => {
                tickets.insert(0, ticket);
            }
            Ok(_) => {}
            Err(cause) => return unavailable("reading a ticket", &cause),
        }
    }
    let pages = Pages {
        newer: page.checked_sub(1),
        older: older.then_some(page + 1),
    };
    html(
        StatusCode::OK,
        &inbox_page(&session, &tickets, focus.as_deref(), pages),
    )
}

/// Links to the neighbouring pages, when they exist.
struct Pages {
    newer: Option<usize>,
    older: Option<usize>,
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    next: String,
}

async fn login(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if !gateway.host_allowed(&headers) {
        return foreign_host();
    }
    // Only paths inside the inbox, in a plain alphabet: never an open redirect, never a
    // header value that cannot be sent.
    let plain = form
        .next
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'/' || b == b'_' || b == b'-');
    let next = if plain && form.next.starts_with("/inbox") && !form.next.contains("//") {
        form.next
    } else {
        "/inbox".to_owned()
    };
    if !gateway.same_origin(&headers) {
        return html(
            StatusCode::FORBIDDEN,
            &shell("Inbox", "<p>Cross-site sign-in refused.</p>"),
        );
    }
    let Some(workspace) = gateway.approvals.owners.workspace(&form.token) else {
        return html(
            StatusCode::UNAUTHORIZED,
            &login_page(&next, Some("That owner token is not valid.")),
        );
    };
    let Some(sealed) = OwnerSession::open(&gateway.approvals, workspace) else {
        return html(
            StatusCode::UNAUTHORIZED,
            &login_page(&next, Some("That owner token is not valid.")),
        );
    };
    tracing::info!(workspace, "owner signed in to the inbox");
    let secure = if gateway.approvals.public_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let mut response = redirect(&next);
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{COOKIE}={sealed}; HttpOnly; SameSite=Strict; Path=/inbox; Max-Age={}{secure}",
            SESSION_TTL.as_secs()
        ))
        .expect("ASCII"),
    );
    response
}

/// Ends the browser's owner session: its cookie is cleared. (Sessions are sealed cookies; one
/// copied elsewhere lives until it expires or the owner credential changes.)
async fn logout(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    if !gateway.host_allowed(&headers) {
        return foreign_host();
    }
    if !gateway.same_origin(&headers) {
        return html(
            StatusCode::FORBIDDEN,
            &shell("Inbox", "<p>Cross-site sign-out refused.</p>"),
        );
    }
    let mut response = redirect("/inbox");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("obol_owner=; HttpOnly; SameSite=Strict; Path=/inbox; Max-Age=0"),
    );
    response
}

#[derive(Deserialize)]
struct DecideForm {
    csrf: String,
    decision: String,
}

async fn decide(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(form): Form<DecideForm>,
) -> Response {
    if !gateway.host_allowed(&headers) {
        return foreign_host();
    }
    let Some(session) = OwnerSession::of(&gateway.approvals, &headers) else {
        return html(
            StatusCode::UNAUTHORIZED,
            &login_page("/inbox", Some("Sign in to decide.")),
        );
    };
    if !gateway.same_origin(&headers)
        || !constant_time_eq(form.csrf.as_bytes(), session.csrf.as_bytes())
    {
        tracing::warn!("inbox decision refused: CSRF check failed");
        return html(
            StatusCode::FORBIDDEN,
            &shell(
                "Inbox",
                "<p>This form is stale or did not come from the inbox. Reload the inbox and try again.</p>",
            ),
        );
    }
    let decision = match form.decision.as_str() {
        "approve" => Decision::Approved,
        "deny" => Decision::Denied,
        _ => {
            return html(
                StatusCode::BAD_REQUEST,
                &shell("Inbox", "<p>Unknown decision.</p>"),
            );
        }
    };
    let not_found = || {
        html(
            StatusCode::NOT_FOUND,
            &shell("Inbox", "<p>No such approval in this workspace.</p>"),
        )
    };
    let Some(id) = ApprovalId::parse(&id) else {
        return not_found();
    };
    let store = &gateway.services.store;
    let ticket = match store.ticket(&id).await {
        Ok(Some(ticket)) if ticket.workspace == session.workspace => ticket,
        Ok(_) => return not_found(),
        Err(cause) => return unavailable("reading an approval to decide it", &cause),
    };
    if ticket.expired(now_ms()) {
        return html(
            StatusCode::CONFLICT,
            &shell(
                "Inbox",
                "<p>This approval has expired; the agent must make the call again.</p>",
            ),
        );
    }
    match store.decide_ticket(&id, decision, now_ms()).await {
        Ok(Decided::Now(ticket)) => {
            tracing::info!(approval = %ticket.id, tool = %ticket.tool, ?decision, "owner decided");
            gateway.services.metrics.approval(match decision {
                Decision::Approved => crate::metrics::ApprovalState::approved,
                Decision::Denied => crate::metrics::ApprovalState::denied,
            });
            // A denial ends the hold at once, with its receipt; an approval waits for the
            // agent to resume.
            if decision == Decision::Denied {
                let settled =
                    crate::invoke::settle_ticket(store, &ticket, crate::invoke::Settlement::Denied)
                        .await;
                if settled != ObolError::ApprovalDenied {
                    tracing::warn!(approval = %ticket.id, "denial recorded; the held slot is settled on the agent's next call ({settled})");
                }
            }
            redirect(&format!("/inbox/{id}"))
        }
        Ok(Decided::Already(_)) => redirect(&format!("/inbox/{id}")),
        Ok(Decided::Missing) => not_found(),
        Err(cause) => unavailable("recording a decision", &cause),
    }
}

fn foreign_host() -> Response {
    html(
        StatusCode::MISDIRECTED_REQUEST,
        &shell(
            "Inbox",
            "<p>This gateway does not answer to that host name; use its public URL.</p>",
        ),
    )
}

/// A store failure: the cause goes to the log, the owner sees only that it may retry.
fn unavailable(during: &str, cause: &StoreError) -> Response {
    tracing::warn!("inbox: {during}: {cause}");
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        &shell("Inbox", "<p>The state store is unavailable; try again.</p>"),
    )
}

fn shell(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Obol · {}</title>\
         <style>body{{font:15px system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}\
         table{{border-collapse:collapse;width:100%}}td,th{{text-align:left;padding:.4rem;border-bottom:1px solid #ddd;vertical-align:top}}\
         tr.focus{{background:#fff6d5}}button{{margin-right:.4rem}}.status{{font-weight:600}}</style></head>\
         <body><h1>Obol approvals</h1>{body}</body></html>",
        escape(title)
    )
}

fn login_page(next: &str, problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p id=\"problem\" role=\"alert\">{}</p>", escape(p)))
        .unwrap_or_default();
    shell(
        "Sign in",
        &format!(
            "{problem}<form method=\"post\" action=\"/inbox/login\">\
             <label>Owner token <input type=\"password\" name=\"token\" id=\"token\" autocomplete=\"off\" required></label>\
             <input type=\"hidden\" name=\"next\" value=\"{}\">\
             <button type=\"submit\" id=\"sign-in\">Sign in</button></form>",
            escape(next)
        ),
    )
}

fn inbox_page(
    session: &OwnerSession,
    tickets: &[Ticket],
    focus: Option<&str>,
    pages: Pages,
) -> String {
    let now = now_ms();
    let mut rows = String::new();
    for ticket in tickets {
        let id = ticket.id.as_str();
        let status = match ticket.status {
            _ if ticket.expired(now) => "expired",
            TicketStatus::Pending => "pending",
            TicketStatus::Approved { .. } => "approved",
            TicketStatus::Denied { .. } => "denied",
        };
        let actions = if status == "pending" {
            format!(
                "<form method=\"post\" action=\"/inbox/{id}/decide\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <button type=\"submit\" name=\"decision\" value=\"approve\" id=\"approve-{id}\">Approve</button>\
                 <button type=\"submit\" name=\"decision\" value=\"deny\" id=\"deny-{id}\">Deny</button></form>",
                escape(&session.csrf)
            )
        } else {
            String::new()
        };
        let summary = ticket
            .summary
            .iter()
            .map(|line| escape(line))
            .collect::<Vec<_>>()
            .join("<br>");
        // A capability call shows both: what the agent called and the provider it resolved to
        // (the approval is for that provider only).
        let provider = match &ticket.capability {
            Some(decision) => format!(
                "<br><span class=\"provider\" id=\"provider-{id}\">→ <code>{}</code></span>",
                escape(&decision.provider)
            ),
            None => String::new(),
        };
        rows.push_str(&format!(
            "<tr id=\"ticket-{id}\"{}><td><code>{}</code>{provider}<br><small>{}</small></td><td>{}</td><td>{summary}</td>\
             <td>{}</td><td>{}</td><td class=\"status\" id=\"status-{id}\">{status}</td><td>{actions}</td></tr>",
            if focus == Some(id) { " class=\"focus\"" } else { "" },
            escape(&ticket.tool),
            escape(id),
            escape(&ticket.connection),
            escape(&ticket.key_name),
            age(ticket.created_at_ms, now),
        ));
    }
    if rows.is_empty() {
        rows = "<tr><td colspan=\"7\">No approvals yet.</td></tr>".into();
    }
    shell(
        "Inbox",
        &format!(
            "<p>Workspace <strong>{}</strong>. Approving lets the agent's next identical call run once; denying ends it.</p>\
             <table><thead><tr><th>Tool</th><th>Connection</th><th>Arguments (redacted)</th><th>Key</th><th>Age</th><th>Status</th><th></th></tr></thead>\
             <tbody>{rows}</tbody></table>{}",
            escape(&session.workspace),
            [
                pages
                    .newer
                    .map(|n| format!("<a href=\"/inbox?page={n}\" id=\"newer\">Newer</a>")),
                pages
                    .older
                    .map(|n| format!("<a href=\"/inbox?page={n}\" id=\"older\">Older</a>")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            escape("<script>\"x\"&'"),
            "&lt;script&gt;&quot;x&quot;&amp;&#39;"
        );
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, "a=1; obol_owner=abc; b=2".parse().unwrap());
        assert_eq!(cookie(&headers, COOKIE), Some("abc"));
    }
}
