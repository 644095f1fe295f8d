//! Generated policy cases: Cedar publications and keys drawn from a seeded generator, so a
//! failure reproduces from its case number.
//!
//! The listed ⇔ callable property test (`property.rs`) checks every case against the catalog
//! in-process; the end-to-end suite (`tests/policy.rs`) replays a sample of the same cases
//! through a real gateway with real `tools/list` and `tools/call` requests. Test support
//! only: compiled for tests and with the `test-util` feature.

/// The seed both the property test and its end-to-end sample start from.
pub const SEED: u64 = 0x5eed_0b01;

/// A small deterministic generator (xorshift).
pub struct Gen(pub u64);

impl Gen {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next_u64() % items.len() as u64) as usize]
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// The names a case may mention: connectors, and tools by their name inside a connector.
/// Globs combine them freely, so a glob may name a tool its connector does not have.
#[derive(Debug, Clone, Copy)]
pub struct Universe<'a> {
    pub connectors: &'a [&'a str],
    pub tools: &'a [&'a str],
}

/// One generated case: a deployment environment, a publication and a key.
#[derive(Debug, Clone)]
pub struct Case {
    /// The position in the generated sequence.
    pub number: usize,
    /// Whether the key, its connections and the deployment are `prod` (else `dev`).
    pub prod: bool,
    /// Cedar policy text.
    pub publication: String,
    /// The key's `allowed_tools` globs.
    pub allowed_tools: Vec<String>,
    /// The key's CEL filter, if any.
    pub filter: Option<String>,
}

/// The first `count` cases of the sequence that starts at [`SEED`].
pub fn generate(universe: Universe<'_>, count: usize) -> Vec<Case> {
    let mut g = Gen(SEED);
    (0..count)
        .map(|number| {
            let prod = g.chance(50);
            let publication = publication(&mut g, universe);
            let (allowed_tools, filter) = key(&mut g, universe);
            Case {
                number,
                prod,
                publication,
                allowed_tools,
                filter,
            }
        })
        .collect()
}

fn condition(g: &mut Gen, universe: Universe<'_>) -> String {
    match g.next_u64() % 7 {
        // Names one tool: no two tools share a decision by their attributes alone then
        // (the publication's verdict memo must stand aside).
        5 => format!(
            "resource == Obol::Tool::\"{}.{}\"",
            g.pick(universe.connectors),
            g.pick(universe.tools)
        ),
        6 => format!(
            "resource in [Obol::Tool::\"{}.{}\"]",
            g.pick(universe.connectors),
            g.pick(universe.tools)
        ),
        0 => "resource.destructive".into(),
        1 => format!("resource.connector == \"{}\"", g.pick(universe.connectors)),
        // Pinned to a connector the other way round, inside a conjunction: the slicing
        // analysis must read both.
        4 => format!(
            "principal.environment == \"dev\" && \"{}\" == resource.connector",
            g.pick(universe.connectors)
        ),
        2 => "principal.environment == \"prod\"".into(),
        _ => format!(
            "resource.connector != \"{}\" && !resource.destructive",
            g.pick(universe.connectors)
        ),
    }
}

/// Permits and forbids, `when` and `unless`, on every action (including list-only,
/// call-only and the approval waiver); sometimes nothing is permitted at all.
fn publication(g: &mut Gen, universe: Universe<'_>) -> String {
    let mut text = String::from("permit(principal, action, resource);\n");
    for _ in 0..(g.next_u64() % 4) {
        let effect = if g.chance(60) { "forbid" } else { "permit" };
        let action = match g.next_u64() % 4 {
            0 => "action",
            1 => "action == Obol::Action::\"call\"",
            2 => "action == Obol::Action::\"call_without_approval\"",
            _ => "action == Obol::Action::\"list\"",
        };
        let clause = if g.chance(50) { "when" } else { "unless" };
        text.push_str(&format!(
            "{effect}(principal, {action}, resource) {clause} {{ {} }};\n",
            condition(g, universe)
        ));
    }
    if g.chance(15) {
        text = "forbid(principal, action, resource);\n".into();
    }
    text
}

/// Globs (connector wildcards, verbatim names, `*`, tool wildcards) and sometimes a filter.
fn key(g: &mut Gen, universe: Universe<'_>) -> (Vec<String>, Option<String>) {
    let mut globs = Vec::new();
    for _ in 0..=(g.next_u64() % 3) {
        let connector = g.pick(universe.connectors);
        let tool = g.pick(universe.tools);
        globs.push(match g.next_u64() % 4 {
            0 => format!("{connector}.*"),
            1 => format!("{connector}.{tool}"),
            2 => "*".into(),
            _ => format!("*.{tool}"),
        });
    }
    let filter = g.chance(20).then(|| "!tool.destructive".to_owned());
    (globs, filter)
}
