//! The gateway kind: tools the gateway answers itself from the catalog snapshot
//! (`search_tools`). Nothing leaves the process, but the call still crosses the whole call
//! boundary: a same-key repeat replays the first answer, and the receipt records it.

use serde_json::{Map, Value, json};

use super::{Outcome, Reply};
use crate::catalog::{Catalog, Route, StatusClass};
use crate::error::ObolError;
use crate::invoke::Services;
use crate::policy::VirtualKey;
use crate::progressive::{self, SearchQuery};

/// The answer, computed when the call is prepared: it is a pure function of the snapshot, the
/// key and the arguments, and a replay returns the recorded one instead.
#[derive(Debug, Clone)]
pub struct Request {
    answer: Value,
}

/// Computes the answer and its pinned facts (`gateway TOOL for KEY_HASH`).
pub fn prepare(
    services: &Services,
    catalog: &Catalog,
    key: &VirtualKey,
    route: &Route,
    arguments: &Map<String, Value>,
) -> Result<(Request, String), ObolError> {
    let answer = match route.name.as_str() {
        progressive::SEARCH_TOOLS => {
            // A search over a catalog missing an upstream's tools would look complete.
            catalog.available(&key.workspace)?;
            let query = SearchQuery::parse(arguments)?;
            let hits: Vec<Value> = catalog
                .search(key, &query.query, query.limit)
                .iter()
                .map(|route| progressive::hit(route))
                .collect();
            json!({ "tools": hits })
        }
        progressive::FIND_CAPABILITY => {
            let capability = arguments
                .get("capability")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let empty = Map::new();
            let inner = arguments
                .get("arguments")
                .and_then(Value::as_object)
                .unwrap_or(&empty);
            crate::invoke::resolve::preview(services, catalog, key, capability, inner)?
        }
        _ => return Err(ObolError::Internal),
    };
    // The answer is the key's own view: another key's same-key repeat must not replay it.
    Ok((
        Request { answer },
        format!("gateway {} for {}", route.name, key.hash),
    ))
}

/// The gateway answered: the one attempt is accepted.
pub fn send(request: &Request) -> Outcome {
    Outcome::Replied {
        reply: Reply::Gateway(request.answer.clone()),
        class: StatusClass::Accepted,
    }
}

pub fn render(
    route: &Route,
    class: StatusClass,
    answer: Value,
) -> Result<super::CallResult, ObolError> {
    let text = json!({ "type": "text", "text": answer.to_string() });
    super::tool_result(route, class, vec![text], Some(answer))
}
