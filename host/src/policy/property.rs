//! Property: for every generated key and policy publication, a tool is listed exactly when it
//! can be called (full mode): `tools/list` and `tools/call` never disagree.

use std::sync::Arc;

use crate::catalog::{Catalog, Connector, Manifest};
use crate::config::Config;
use crate::policy::{
    Environment, KeyHash, PolicyPin, Publication, Scope, ToolFilter, ToolGlob, VirtualKey,
};
use crate::runtime::{Runtime, wit};

/// A small deterministic generator (xorshift), so a failure reproduces from its seed.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const CONNECTORS: [&str; 3] = ["alpha", "beta", "gamma"];
const TOOLS: [(&str, bool); 4] = [
    ("read", false),
    ("items.list", false),
    ("delete", true),
    ("items.purge", true),
];

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
            })
        })
        .collect()
}

fn catalog(connectors: &[Arc<Connector>], publication: Arc<Publication>, prod: bool) -> Catalog {
    let mut toml = format!(
        "[server]\nenvironment = \"{}\"\n[[workspaces]]\nid = \"w\"\n",
        if prod { "prod" } else { "dev" }
    );
    for name in CONNECTORS {
        toml.push_str(&format!(
            "[[workspaces.connections]]\nid = \"{name}\"\nconnector = \"{name}\"\nbase_url = \"http://127.0.0.1:9\"\n"
        ));
    }
    let mut config = Config::parse(&toml, std::path::Path::new(".")).unwrap();
    config.workspaces[0].publications.push(publication);
    Catalog::build(connectors.to_vec(), &config.workspaces)
}

fn condition(g: &mut Gen) -> String {
    match g.next() % 5 {
        0 => "resource.destructive".into(),
        1 => format!("resource.connector == \"{}\"", g.pick(&CONNECTORS)),
        // Pinned to a connector the other way round, inside a conjunction: the slicing
        // analysis must read both.
        4 => format!(
            "principal.environment == \"dev\" && \"{}\" == resource.connector",
            g.pick(&CONNECTORS)
        ),
        2 => "principal.environment == \"prod\"".into(),
        _ => format!(
            "resource.connector != \"{}\" && !resource.destructive",
            g.pick(&CONNECTORS)
        ),
    }
}

fn publication(g: &mut Gen) -> String {
    let mut text = String::from("permit(principal, action, resource);\n");
    for _ in 0..(g.next() % 4) {
        let effect = if g.chance(60) { "forbid" } else { "permit" };
        let action = match g.next() % 4 {
            0 => "action",
            1 => "action == Obol::Action::\"call\"",
            2 => "action == Obol::Action::\"call_without_approval\"",
            _ => "action == Obol::Action::\"list\"",
        };
        let clause = if g.chance(50) { "when" } else { "unless" };
        text.push_str(&format!(
            "{effect}(principal, {action}, resource) {clause} {{ {} }};\n",
            condition(g)
        ));
    }
    if g.chance(15) {
        // Sometimes nothing is permitted at all.
        text = "forbid(principal, action, resource);\n".into();
    }
    text
}

fn key(g: &mut Gen, prod: bool) -> VirtualKey {
    let mut globs = Vec::new();
    for _ in 0..=(g.next() % 3) {
        let connector = g.pick(&CONNECTORS);
        let (tool, _) = g.pick(&TOOLS);
        let glob = match g.next() % 4 {
            0 => format!("{connector}.*"),
            1 => format!("{connector}.{tool}"),
            2 => "*".into(),
            _ => format!("*.{tool}"),
        };
        globs.push(ToolGlob::parse(&glob).unwrap());
    }
    let filter = g
        .chance(20)
        .then(|| ToolFilter::compile("!tool.destructive").unwrap());
    VirtualKey {
        name: "k".into(),
        hash: KeyHash::of_token("k"),
        workspace: "w".into(),
        environment: if prod {
            Environment::Prod
        } else {
            Environment::Dev
        },
        allowed_tools: globs,
        scopes: vec![Scope::Mcp],
        filter,
        policy: PolicyPin::Latest,
    }
}

#[test]
fn listing_and_calling_agree_over_a_thousand_generated_cases() {
    let runtime = Runtime::new(crate::config::RuntimeConfig {
        max_concurrent_calls: 2,
        ..Default::default()
    })
    .unwrap();
    let connectors = connectors(&runtime);
    let mut g = Gen(0x5eed_0b01_u64);
    let mut listed_total = 0;
    let mut hidden_total = 0;
    for case in 0..1000 {
        let prod = g.chance(50);
        let text = publication(&mut g);
        let publication = Arc::new(Publication::parse(1, &text).unwrap());
        let catalog = catalog(&connectors, publication, prod);
        let key = key(&mut g, prod);
        let listing: serde_json::Value = serde_json::from_str(&catalog.listing(&key)).unwrap();
        let listed: Vec<String> = listing["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect();
        for connector in CONNECTORS {
            for (tool, _) in TOOLS {
                let name = format!("{connector}.{tool}");
                // Slicing the publication by connector and action never changes a decision.
                let route = catalog.route("w", &name).unwrap();
                for needs_approval in [false, true] {
                    assert_eq!(
                        catalog
                            .policies
                            .decide_with(&key, route, needs_approval, true),
                        catalog
                            .policies
                            .decide_with(&key, route, needs_approval, false),
                        "case {case}: {name}\n{text}"
                    );
                }
                let callable = crate::invoke::route(&catalog, &key, &name).is_some();
                let is_listed = listed.contains(&name);
                assert_eq!(
                    callable, is_listed,
                    "case {case}: {name} listed={is_listed} callable={callable}\n{text}\nkey {:?}",
                    key.allowed_tools
                );
                if is_listed {
                    listed_total += 1;
                } else {
                    hidden_total += 1;
                }
            }
        }
    }
    // The generator exercises both sides of the property.
    assert!(
        listed_total > 500 && hidden_total > 500,
        "{listed_total} / {hidden_total}"
    );
}
