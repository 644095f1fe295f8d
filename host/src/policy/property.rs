//! Property: for every generated key and policy publication, a tool is listed exactly when it
//! can be called (full mode): `tools/list` and `tools/call` never disagree.
//!
//! The two sides are computed independently, so that a listing that drifts from calling
//! fails the test. The listed side is the catalog's `tools/list` answer, which reads the
//! key's cached view. The callable side never reads a view: it is decided per name from the
//! primitives a call is made of (the name parsed, the route looked up, the prefilter, Cedar
//! over the whole publication, unsliced), on a second catalog built from the same
//! configuration, so it shares no cache with the first (neither the views nor the
//! publication's slices). `tests/policy.rs` replays a sample of the same cases through a
//! real gateway with real `tools/list` and `tools/call` requests.

use std::sync::Arc;

use crate::catalog::{Catalog, Connector, Manifest, ToolName};
use crate::config::Config;
use crate::policy::cases::{self, Case, Universe};
use crate::policy::cedar::Slicing;
use crate::policy::{
    ApprovalQuestion, Environment, KeyHash, PolicyPin, Publication, Scope, ToolFilter, ToolGlob,
    ToolsMode, Verdict, VirtualKey, prefilter_refusal,
};
use crate::runtime::{Runtime, wit};

const CONNECTORS: [&str; 3] = ["alpha", "beta", "gamma"];
const TOOLS: [(&str, bool); 4] = [
    ("read", false),
    ("items.list", false),
    ("delete", true),
    ("items.purge", true),
];
const TOOL_NAMES: [&str; 4] = ["read", "items.list", "delete", "items.purge"];
/// Names no catalog has: calling them must be refused, and no listing may contain them.
const ABSENT: [&str; 4] = ["alpha.nope", "delta.read", "read", "alpha."];

fn connectors(runtime: &Runtime) -> Vec<Arc<Connector>> {
    let (guest, raw) = runtime
        .load(include_bytes!(env!("OBOL_GUEST_PAYMENTS")))
        .unwrap();
    let guest = Arc::new(guest);
    let template = raw.tools[0].clone();
    CONNECTORS
        .iter()
        .map(|name| {
            let tools = TOOLS
                .iter()
                .map(|(tool, destructive)| {
                    let mut t = template.clone();
                    t.name = (*tool).into();
                    t.effect.destructive = *destructive;
                    t
                })
                .collect();
            let manifest = Manifest::validate(wit::Manifest {
                name: (*name).into(),
                version: "1".into(),
                tools,
            })
            .unwrap();
            Arc::new(Connector {
                manifest,
                guest: Arc::clone(&guest),
                provenance: crate::catalog::trust::Provenance::Unchecked,
            })
        })
        .collect()
}

/// The environment a case's gateway and key belong to.
fn environment(case: &Case) -> Environment {
    if case.prod {
        Environment::Prod
    } else {
        Environment::Dev
    }
}

fn catalog(connectors: &[Arc<Connector>], publication: &str, environment: Environment) -> Catalog {
    let mut toml = format!(
        "[server]\nenvironment = \"{}\"\n[[workspaces]]\nid = \"w\"\n",
        environment.as_str()
    );
    for name in CONNECTORS {
        toml.push_str(&format!(
            "[[workspaces.connections]]\nid = \"{name}\"\nconnector = \"{name}\"\nbase_url = \"http://127.0.0.1:9\"\n"
        ));
    }
    let mut config = Config::parse(&toml, std::path::Path::new(".")).unwrap();
    config.workspaces[0]
        .publications
        .push(Arc::new(Publication::parse(1, publication).unwrap()));
    Catalog::build(connectors.to_vec(), &config.workspaces, &Default::default())
}

fn key(case: &Case) -> VirtualKey {
    VirtualKey {
        name: "k".into(),
        hash: KeyHash::of_token("k"),
        workspace: "w".into(),
        environment: environment(case),
        allowed_tools: case
            .allowed_tools
            .iter()
            .map(|glob| ToolGlob::parse(glob).unwrap())
            .collect(),
        scopes: vec![Scope::Mcp],
        filter: case
            .filter
            .as_deref()
            .map(|filter| ToolFilter::compile(filter).unwrap()),
        policy: PolicyPin::Latest,
        tools_mode: ToolsMode::Full,
        capability_pins: Default::default(),
    }
}

/// Whether a call of `name` by `key` is authorized, and under which verdict, decided from
/// the primitives alone: never through a key's view, and with Cedar evaluating every policy
/// of the publication (no slice).
fn callable(catalog: &Catalog, key: &VirtualKey, name: &str) -> Option<Verdict> {
    let parsed = ToolName::parse(name)?;
    let route = catalog.route(&key.workspace, parsed.as_str())?;
    if prefilter_refusal(key, route).is_some() {
        return None;
    }
    let question =
        if route.tool().effect.destructive && route.connection.environment == Environment::Prod {
            ApprovalQuestion::Ask
        } else {
            ApprovalQuestion::NotAsked
        };
    let verdict = catalog
        .policies
        .decide_with(key, route, question, Slicing::Unsliced);
    verdict.allowed.then_some(verdict)
}

#[test]
fn listing_and_calling_agree_over_a_thousand_generated_cases() {
    let runtime = Runtime::new(crate::config::RuntimeConfig {
        max_concurrent_calls: 2,
        ..Default::default()
    })
    .unwrap();
    let connectors = connectors(&runtime);
    let universe = Universe {
        connectors: &CONNECTORS,
        tools: &TOOL_NAMES,
    };
    let names: Vec<String> = CONNECTORS
        .iter()
        .flat_map(|connector| {
            TOOLS
                .iter()
                .map(move |(tool, _)| format!("{connector}.{tool}"))
        })
        .collect();
    let mut listed_total = 0;
    let mut hidden_total = 0;
    let mut reached_total = 0;
    for case in cases::generate(universe, 1000) {
        let key = key(&case);
        let publication = &case.publication;
        // Two snapshots of the same configuration: one lists, the other decides calls.
        let listing_catalog = catalog(&connectors, publication, environment(&case));
        let calling_catalog = catalog(&connectors, publication, environment(&case));
        let context = || format!("case {}\n{publication}key {case:?}", case.number);

        // search_tools (progressive mode) ranks over the same view: whatever a key can find
        // it can call, and it can find every tool it can call by its name.
        let callable_names: std::collections::BTreeSet<&str> = names
            .iter()
            .filter(|name| callable(&calling_catalog, &key, name).is_some())
            .map(String::as_str)
            .collect();
        for query in [
            "alpha",
            "beta",
            "gamma",
            "read",
            "items list",
            "delete",
            "purge",
            "x",
        ] {
            for found in listing_catalog.search(&key, query, 20) {
                assert!(
                    callable_names.contains(found.name.as_str()),
                    "search {query:?} found {} which the key cannot call\n{}",
                    found.name,
                    context()
                );
            }
        }
        for name in &callable_names {
            let found = listing_catalog.search(&key, name, 20);
            assert!(
                found.iter().any(|route| route.name.as_str() == *name),
                "searching {name:?} did not find it\n{}",
                context()
            );
        }

        let listing: serde_json::Value =
            serde_json::from_str(&listing_catalog.listing(&key).unwrap()).unwrap();
        let mut listed: Vec<String> = listing["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        listed.sort();
        let decided: Vec<(&str, Option<Verdict>)> = names
            .iter()
            .map(String::as_str)
            .chain(ABSENT)
            .map(|name| (name, callable(&calling_catalog, &key, name)))
            .collect();
        let mut callable_names: Vec<String> = decided
            .iter()
            .filter(|(_, verdict)| verdict.is_some())
            .map(|(name, _)| (*name).to_owned())
            .collect();
        callable_names.sort();
        assert_eq!(listed, callable_names, "listed vs callable\n{}", context());
        // What `tools/call` routes agrees too, down to the verdict its receipt and approval
        // follow.
        for (name, verdict) in decided {
            let routed = crate::invoke::route(&listing_catalog, &key, name).map(|(_, v)| v);
            assert_eq!(routed, verdict, "{name} routed\n{}", context());
        }
        listed_total += listed.len();
        hidden_total += names.len() - listed.len();

        // Progressive mode is never a bypass. Through the lifecycle's own parse, route and
        // authorize phases, on a third snapshot (no shared view), `call_tool(X)` by the same
        // key in progressive mode is admitted exactly when X is callable in full mode, as
        // X and under the same verdict; every other name is refused with the very answer an
        // absent name gets.
        let progressive_key = VirtualKey {
            tools_mode: ToolsMode::Progressive,
            ..key.clone()
        };
        let progressive_catalog = catalog(&connectors, publication, environment(&case));
        let absent = refusal(&progressive_catalog, &progressive_key, "alpha.nope");
        for (name, verdict) in names
            .iter()
            .map(String::as_str)
            .chain(ABSENT)
            .map(|name| (name, callable(&calling_catalog, &key, name)))
        {
            match (
                call_tool(&progressive_catalog, &progressive_key, name),
                verdict,
            ) {
                (Ok(admitted), Some(verdict)) => {
                    assert_eq!(admitted, (name.to_owned(), verdict), "{}", context());
                }
                (Err(answer), None) => {
                    assert_eq!(answer, absent, "{name} refused\n{}", context());
                }
                (got, expected) => {
                    panic!(
                        "call_tool({name}): {got:?}, full mode: {expected:?}\n{}",
                        context()
                    )
                }
            }
            reached_total += 1;
        }

        // Slicing the publication by connector and action never changes a decision.
        for name in &names {
            let route = listing_catalog.route("w", name).unwrap();
            for question in [ApprovalQuestion::NotAsked, ApprovalQuestion::Ask] {
                assert_eq!(
                    listing_catalog
                        .policies
                        .decide_with(&key, route, question, Slicing::Sliced),
                    calling_catalog
                        .policies
                        .decide_with(&key, route, question, Slicing::Unsliced),
                    "{name} sliced vs unsliced\n{}",
                    context()
                );
            }
        }
    }
    // The generator exercises both sides of the property.
    assert!(
        listed_total > 500 && hidden_total > 500,
        "{listed_total} / {hidden_total}"
    );
    assert!(reached_total >= 1000 * (names.len() + ABSENT.len()));
}

/// A `tools/call` of `call_tool(name)` with arguments every generated tool's schema admits.
fn call_tool_request(name: &str) -> crate::invoke::CallRequest {
    let params = serde_json::json!({
        "name": "call_tool",
        "arguments": {"name": name, "arguments": {"charge": "ch_1", "amount": 100}},
    });
    crate::invoke::CallRequest {
        params: params.as_object().unwrap().clone(),
        exactness: Ok(()),
        idempotency_key: Some(
            crate::idempotency::IdempotencyKey::parse("idt_property-key-00001").unwrap(),
        ),
        approval: None,
        trace_id: None,
    }
}

/// What `call_tool(name)` is admitted as: the tool it runs and the verdict it runs under, or
/// the refusal as the client would read it (error, code and the key it names).
fn call_tool(catalog: &Catalog, key: &VirtualKey, name: &str) -> Result<(String, Verdict), String> {
    match crate::invoke::admit(catalog, key, call_tool_request(name)) {
        Ok(admitted) => Ok((
            admitted.routed.route.name.as_str().to_owned(),
            admitted.routed.verdict,
        )),
        Err(answer) => Err(format!(
            "{:?} {:?}",
            answer.result.map_err(|e| (e.wire(), e.to_string())),
            answer.identity.map(|i| i.key)
        )),
    }
}

fn refusal(catalog: &Catalog, key: &VirtualKey, name: &str) -> String {
    call_tool(catalog, key, name).expect_err("an absent name is refused")
}
