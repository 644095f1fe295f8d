//! Cedar policies: per-workspace, immutable, numbered publications.
//!
//! Entities: `Obol::Key::"<key name>"` (in `Obol::Workspace`), `Obol::Tool::"connector.tool"`
//! (attributes `connector`, `destructive`, `environment`, `route`, `propagation`, and in
//! `Obol::Connection::"<id>"`); actions `Obol::Action::"list"` and `Obol::Action::"call"`.
//!
//! A tool is visible when both `list` and `call` are allowed. Today a call's Cedar context is
//! the same as a listing's (empty), so "call would not be categorically denied" is exactly
//! "call is allowed", and listing and calling cannot disagree (ADR-0005).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex};

use cedar_policy::{
    ActionConstraint, Authorizer, Context, Decision, Entities, Entity, EntityId, EntityTypeName,
    EntityUid, Policy, PolicySet, Request, RestrictedExpression,
};

/// Entity type names and action ids, parsed once: Cedar's parser is far slower than the
/// evaluation it feeds.
struct Names {
    key: EntityTypeName,
    tool: EntityTypeName,
    workspace: EntityTypeName,
    connection: EntityTypeName,
    actions: [EntityUid; 2],
    waive: EntityUid,
}

static NAMES: LazyLock<Names> = LazyLock::new(|| {
    let kind = |name: &str| EntityTypeName::from_str(name).expect("a literal type name");
    let action = kind("Obol::Action");
    Names {
        key: kind("Obol::Key"),
        tool: kind("Obol::Tool"),
        workspace: kind("Obol::Workspace"),
        connection: kind("Obol::Connection"),
        actions: [
            EntityUid::from_type_name_and_id(action.clone(), EntityId::new("list")),
            EntityUid::from_type_name_and_id(action.clone(), EntityId::new("call")),
        ],
        waive: EntityUid::from_type_name_and_id(action, EntityId::new("call_without_approval")),
    }
});

use super::VirtualKey;
use crate::catalog::Route;

/// Which publication a key evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyPin {
    Latest,
    Number(u32),
}

impl PolicyPin {
    pub fn parse(text: &str) -> Result<PolicyPin, String> {
        match text {
            "latest" => Ok(PolicyPin::Latest),
            number => number
                .parse()
                .map(PolicyPin::Number)
                .map_err(|_| format!("policy pin {text:?} is neither \"latest\" nor a number")),
        }
    }
}

/// One publication: its number and its parsed policies.
#[derive(Debug)]
pub struct Publication {
    pub number: u32,
    policies: PolicySet,
    /// Each static policy with the connector its `when` conditions pin, if any.
    sliceable: Option<Vec<(Policy, Option<String>)>>,
    /// The policies that can apply to a tool of a connector, per action, built on first use.
    /// A policy whose `when` requires `resource.connector == "x"` can neither permit nor
    /// forbid a tool of another connector, so leaving it out changes no decision and saves
    /// evaluating it (ADR-0005).
    slices: Mutex<HashMap<(String, usize), Arc<PolicySet>>>,
    /// Whether any policy mentions a tool entity (`Obol::Tool::"…"`) or the publication has
    /// templates. Otherwise Cedar cannot tell two tools apart by anything but the
    /// attributes and parents in [`Signature`], so one decision serves every tool with the
    /// same signature: a key's first listing over 1,000 tools evaluates a few dozen.
    names_tools: bool,
    verdicts: Mutex<HashMap<Signature, Verdict>>,
}

/// Everything a decision reads besides the tool's name: the key entity (name, environment,
/// workspace), the tool entity's attributes and parent connection, and the question asked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Signature {
    key: String,
    key_environment: &'static str,
    workspace: String,
    connector: String,
    connection: String,
    environment: &'static str,
    destructive: bool,
    route: &'static str,
    propagation: &'static str,
    question: ApprovalQuestion,
}

impl Signature {
    fn of(key: &VirtualKey, route: &Route, question: ApprovalQuestion) -> Signature {
        let effect = &route.tool().effect;
        Signature {
            key: key.name.clone(),
            key_environment: key.environment.as_str(),
            workspace: key.workspace.clone(),
            connector: route.name.connector().to_owned(),
            connection: route.connection.id.clone(),
            environment: route.connection.environment.as_str(),
            destructive: effect.destructive,
            route: effect.route.label(),
            propagation: effect.propagation.label(),
            question,
        }
    }
}

/// Memoised decisions per publication, at most this many (then decided afresh each time).
const MAX_VERDICTS: usize = 1 << 16;

impl Publication {
    pub fn parse(number: u32, text: &str) -> Result<Publication, String> {
        let policies = PolicySet::from_str(text)
            .map_err(|e| format!("publication {number} does not parse: {e}"))?;
        // Templates would need linking to analyse; a publication with any is never sliced.
        let sliceable = (policies.templates().next().is_none()).then(|| {
            policies
                .policies()
                .map(|p| (p.clone(), pinned_connector(p)))
                .collect()
        });
        let names_tools = sliceable.is_none()
            || policies.policies().any(|policy| {
                policy
                    .to_json()
                    .map_or(true, |json| json.to_string().contains("Obol::Tool"))
            });
        Ok(Publication {
            number,
            policies,
            sliceable,
            slices: Mutex::default(),
            names_tools,
            verdicts: Mutex::default(),
        })
    }

    /// The policies that can decide `action` (an index into the action names) on a tool of
    /// `connector`.
    fn slice(&self, connector: &str, action: usize, uid: &EntityUid) -> Arc<PolicySet> {
        let Some(sliceable) = &self.sliceable else {
            return Arc::new(self.policies.clone());
        };
        let key = (connector.to_owned(), action);
        if let Some(slice) = self.slices.lock().expect("slices").get(&key) {
            return Arc::clone(slice);
        }
        let mut slice = PolicySet::new();
        for (policy, pinned) in sliceable {
            let connector_may_match = pinned.as_deref().is_none_or(|c| c == connector);
            let action_may_match = match policy.action_constraint() {
                ActionConstraint::Any => true,
                ActionConstraint::Eq(a) => &a == uid,
                // Action groups are not used by Obol's actions; keep such policies.
                ActionConstraint::In(_) => true,
            };
            if connector_may_match && action_may_match {
                slice
                    .add(policy.clone())
                    .expect("ids are unique within one publication");
            }
        }
        let slice = Arc::new(slice);
        self.slices
            .lock()
            .expect("slices")
            .insert(key, Arc::clone(&slice));
        slice
    }
}

/// The connector a policy's `when` conditions require by a top-level conjunct
/// `resource.connector == "<literal>"` (either way round). `unless` clauses never pin.
fn pinned_connector(policy: &Policy) -> Option<String> {
    let json = policy.to_json().ok()?;
    json["conditions"]
        .as_array()?
        .iter()
        .filter(|c| c["kind"] == "when")
        .find_map(|c| conjunct_connector(&c["body"]))
}

fn conjunct_connector(expr: &serde_json::Value) -> Option<String> {
    if let Some(and) = expr.get("&&") {
        return conjunct_connector(&and["left"]).or_else(|| conjunct_connector(&and["right"]));
    }
    let eq = expr.get("==")?;
    let is_connector = |e: &serde_json::Value| {
        e["."]["attr"] == "connector" && e["."]["left"]["Var"] == "resource"
    };
    let literal = |e: &serde_json::Value| e["Value"].as_str().map(str::to_owned);
    if is_connector(&eq["left"]) {
        literal(&eq["right"])
    } else if is_connector(&eq["right"]) {
        literal(&eq["left"])
    } else {
        None
    }
}

/// Every workspace's publications.
#[derive(Debug, Default)]
pub struct Policies {
    by_workspace: HashMap<String, BTreeMap<u32, Arc<Publication>>>,
}

/// What Cedar decided for one key and tool, for the receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `None` when the workspace has no publication (the prefilter alone governs it).
    pub publication: Option<u32>,
    pub allowed: bool,
    /// The policies that determined the decision (and, when waived, the waiver).
    pub policies: Vec<String>,
    pub approval: ApprovalRule,
}

/// Whether a call must wait for a human.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalRule {
    /// Not a destructive production tool.
    NotRequired,
    /// Destructive in prod, and no policy permits `call_without_approval`.
    Required,
    /// Destructive in prod, and a policy explicitly permits `call_without_approval`.
    Waived,
}

/// Whether a decision also asks Cedar if a policy waives the human's approval
/// (`call_without_approval`). Asked for a destructive production tool, which waits for a
/// human unless a policy waives it (ADR-0006).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApprovalQuestion {
    /// The tool needs approval unless waived: ask, and answer `Required` or `Waived`.
    Ask,
    /// Nothing to waive: the verdict's rule is `NotRequired`.
    NotAsked,
}

/// Which policies of a publication Cedar evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slicing {
    /// Only those that can apply to the tool's connector and the action (the publication's
    /// cached slice): the same decision, faster.
    Sliced,
    /// Every policy: what the property test checks the slices against (test builds only).
    #[cfg(test)]
    Unsliced,
}

impl Policies {
    pub fn add(&mut self, workspace: &str, publication: Arc<Publication>) {
        self.by_workspace
            .entry(workspace.to_owned())
            .or_default()
            .insert(publication.number, publication);
    }

    /// The publication `key` evaluates under, if its workspace has any.
    pub fn publication_for(&self, key: &VirtualKey) -> Option<Arc<Publication>> {
        let publications = self.by_workspace.get(&key.workspace)?;
        match key.policy {
            PolicyPin::Latest => publications.values().next_back().cloned(),
            PolicyPin::Number(n) => publications.get(&n).cloned(),
        }
    }

    pub fn has_workspace(&self, workspace: &str) -> bool {
        self.by_workspace.contains_key(workspace)
    }

    /// Both `list` and `call` must be allowed. A workspace without publications is governed
    /// by the prefilter alone; a key pinned to a publication that does not exist sees nothing.
    /// [`ApprovalQuestion::Ask`] (a destructive production tool) additionally asks whether a
    /// policy waives the approval; without publications nothing can.
    pub fn decide(&self, key: &VirtualKey, route: &Route, question: ApprovalQuestion) -> Verdict {
        self.decide_with(key, route, question, Slicing::Sliced)
    }

    /// [`Policies::decide`], with the policies to evaluate chosen; the property test checks
    /// that both [`Slicing`]s agree.
    pub(super) fn decide_with(
        &self,
        key: &VirtualKey,
        route: &Route,
        question: ApprovalQuestion,
        slicing: Slicing,
    ) -> Verdict {
        let unwaived = match question {
            ApprovalQuestion::Ask => ApprovalRule::Required,
            ApprovalQuestion::NotAsked => ApprovalRule::NotRequired,
        };
        let refused = |publication: Option<u32>| Verdict {
            publication,
            allowed: false,
            policies: Vec::new(),
            approval: unwaived,
        };
        if !self.has_workspace(&key.workspace) {
            return Verdict {
                allowed: true,
                ..refused(None)
            };
        }
        let Some(publication) = self.publication_for(key) else {
            return refused(None);
        };
        let signature = (slicing == Slicing::Sliced && !publication.names_tools)
            .then(|| Signature::of(key, route, question));
        if let Some(signature) = &signature
            && let Some(verdict) = publication
                .verdicts
                .lock()
                .expect("verdicts")
                .get(signature)
        {
            return verdict.clone();
        }
        let Ok((entities, principal, resource)) = entities(key, route) else {
            return refused(Some(publication.number));
        };
        let evaluate = |index: usize, action: &EntityUid, policies: &mut Vec<String>| -> bool {
            let slice = match slicing {
                Slicing::Sliced => publication.slice(route.name.connector(), index, action),
                #[cfg(test)]
                Slicing::Unsliced => Arc::new(publication.policies.clone()),
            };
            let Ok(request) = Request::new(
                principal.clone(),
                action.clone(),
                resource.clone(),
                Context::empty(),
                None,
            ) else {
                return false;
            };
            let response = Authorizer::new().is_authorized(&request, &slice, &entities);
            // Operators name policies with `@id("…")`; Cedar's own ids are positional. Cedar
            // reports reasons as a set: sorted, so receipts are deterministic.
            let mut reasons: Vec<String> = response
                .diagnostics()
                .reason()
                .map(|id| {
                    publication
                        .policies
                        .annotation(id, "id")
                        .map_or_else(|| id.to_string(), str::to_owned)
                })
                .collect();
            reasons.sort();
            for name in reasons {
                if !policies.contains(&name) {
                    policies.push(name);
                }
            }
            response.decision() == Decision::Allow
        };
        let mut policies = Vec::new();
        let allowed = NAMES
            .actions
            .iter()
            .enumerate()
            .all(|(index, action)| evaluate(index, action, &mut policies));
        // Only a waiver that holds is worth naming in the receipt.
        let mut waivers = Vec::new();
        let approval = if allowed
            && question == ApprovalQuestion::Ask
            && evaluate(NAMES.actions.len(), &NAMES.waive, &mut waivers)
        {
            for waiver in waivers {
                if !policies.contains(&waiver) {
                    policies.push(waiver);
                }
            }
            ApprovalRule::Waived
        } else {
            unwaived
        };
        let verdict = Verdict {
            publication: Some(publication.number),
            allowed,
            policies,
            approval,
        };
        if let Some(signature) = signature {
            let mut verdicts = publication.verdicts.lock().expect("verdicts");
            if verdicts.len() < MAX_VERDICTS {
                verdicts.insert(signature, verdict.clone());
            }
        }
        verdict
    }
}

fn uid(kind: &EntityTypeName, id: &str) -> EntityUid {
    EntityUid::from_type_name_and_id(kind.clone(), EntityId::new(id))
}

fn entities(key: &VirtualKey, route: &Route) -> Result<(Entities, EntityUid, EntityUid), String> {
    let names = &*NAMES;
    let workspace = uid(&names.workspace, &key.workspace);
    let connection = uid(&names.connection, &route.connection.id);
    let principal = uid(&names.key, &key.name);
    let resource = uid(&names.tool, route.name.as_str());
    let tool = route.tool();
    let string = |s: &str| RestrictedExpression::new_string(s.to_owned());
    let key_entity = Entity::new(
        principal.clone(),
        HashMap::from([
            ("name".to_owned(), string(&key.name)),
            ("environment".to_owned(), string(key.environment.as_str())),
        ]),
        HashSet::from([workspace.clone()]),
    )
    .map_err(|e| e.to_string())?;
    let route_kind = tool.effect.route.label();
    let tool_entity = Entity::new(
        resource.clone(),
        HashMap::from([
            ("connector".to_owned(), string(route.name.connector())),
            (
                "destructive".to_owned(),
                RestrictedExpression::new_bool(tool.effect.destructive),
            ),
            (
                "environment".to_owned(),
                string(route.connection.environment.as_str()),
            ),
            ("route".to_owned(), string(route_kind)),
            (
                "propagation".to_owned(),
                string(tool.effect.propagation.label()),
            ),
        ]),
        HashSet::from([connection.clone()]),
    )
    .map_err(|e| e.to_string())?;
    let entities = Entities::from_entities(
        [
            key_entity,
            tool_entity,
            Entity::with_uid(workspace),
            Entity::with_uid(connection),
        ],
        None,
    )
    .map_err(|e| e.to_string())?;
    Ok((entities, principal, resource))
}
