//! The relevance set: 37 queries a user might type, each with the tool they mean, written
//! before the ranking was tuned (paraphrases that share no word with the tool's name, typos,
//! a bare connector prefix), over a catalog of 255 realistic tools across 90 vendors.

use super::*;

fn catalog() -> Index {
    Index::build(
        include_str!("catalog.txt")
            .lines()
            .filter_map(|line| line.split_once('|'))
            .map(|(name, description)| Entry {
                name: name.to_owned(),
                description: description.to_owned(),
            })
            .collect(),
    )
}

fn queries() -> Vec<(&'static str, &'static str)> {
    include_str!("queries.txt")
        .lines()
        .filter_map(|line| line.split_once('|'))
        .collect()
}

#[test]
fn the_relevance_floor_is_top_5_at_least_90_percent() {
    let index = catalog();
    assert!(index.len() >= 250);
    let queries = queries();
    assert!(queries.len() >= 30);
    let (mut top1, mut top5, mut misses) = (0, 0, Vec::new());
    for (query, wanted) in &queries {
        let hits: Vec<&str> = index
            .search(query, |_| true, 20)
            .into_iter()
            .map(|id| index.entry(id).name.as_str())
            .collect();
        match hits.iter().position(|name| name == wanted) {
            Some(0) => {
                top1 += 1;
                top5 += 1;
            }
            Some(rank) if rank < 5 => top5 += 1,
            rank => misses.push(format!(
                "{query:?}: {wanted} at {rank:?}; got {:?}",
                &hits[..hits.len().min(5)]
            )),
        }
    }
    let n = queries.len();
    println!(
        "search relevance: top-1 {top1}/{n} ({:.0} %), top-5 {top5}/{n} ({:.0} %)",
        100.0 * top1 as f64 / n as f64,
        100.0 * top5 as f64 / n as f64
    );
    assert!(top5 * 10 >= n * 9, "top-5 {top5}/{n}; misses: {misses:#?}");
}

#[test]
fn a_bare_connector_prefix_surfaces_that_connector_first() {
    let index = catalog();
    let hits = index.search("github", |_| true, 20);
    assert!(hits.len() >= 10);
    for id in &hits[..10] {
        assert!(
            index.entry(*id).name.starts_with("github."),
            "{}",
            index.entry(*id).name
        );
    }
}

#[test]
fn hidden_tools_never_appear_and_do_not_change_the_order_of_the_rest() {
    let index = catalog();
    let all = index.search("delete a file", |_| true, 20);
    let hidden = all[0];
    let filtered = index.search("delete a file", |id| id != hidden, 20);
    assert!(!filtered.contains(&hidden));
    // The others keep their order; one more may slide in at the end.
    let without: Vec<usize> = all.iter().copied().filter(|id| *id != hidden).collect();
    let n = without.len().min(filtered.len());
    assert_eq!(filtered[..n], without[..n]);
}

#[test]
fn words_split_names_and_fold_plurals() {
    assert_eq!(
        words("github.issues.add_labels"),
        ["github", "issue", "add", "label"]
    );
    assert_eq!(
        words("postMessage to the Channels"),
        ["post", "message", "channel"]
    );
    assert!(within("refnd", "refund", 1));
    assert!(!within("refund", "charge", 2));
}

/// A hidden tool changes nothing: over the relevance catalog with every third tool hidden,
/// every query (the relevance set, each hidden tool's own name, and typos of its words) gets
/// exactly the answer of an index built from the visible tools alone. Before, the hidden
/// tools' words counted as known (so a typo of a hidden word was not corrected, and the
/// answer went empty) and they weighed in every term's frequency.
#[test]
fn hidden_tools_change_nothing_in_the_answer() {
    let all: Vec<Entry> = include_str!("catalog.txt")
        .lines()
        .filter_map(|line| line.split_once('|'))
        .map(|(name, description)| Entry {
            name: name.to_owned(),
            description: description.to_owned(),
        })
        .collect();
    let hidden = |id: usize| id % 3 == 1;
    let full = Index::build(all.clone());
    let visible_only = Index::build(
        all.iter()
            .enumerate()
            .filter(|(id, _)| !hidden(*id))
            .map(|(_, entry)| entry.clone())
            .collect(),
    );
    let mut probes: Vec<String> = queries().iter().map(|(q, _)| q.to_string()).collect();
    for (id, entry) in all.iter().enumerate().filter(|(id, _)| hidden(*id)) {
        probes.push(entry.name.clone());
        // A hidden tool's word with its last letter dropped: one edit from the hidden word.
        if let Some(word) = entry.description.split_whitespace().find(|w| w.len() >= 6) {
            probes.push(word[..word.len() - 1].to_owned());
        }
        probes.push(format!("{} {}", entry.name, id));
    }
    for probe in &probes {
        let answer = |index: &Index, visible: &dyn Fn(usize) -> bool| -> Vec<String> {
            index
                .search(probe, visible, 20)
                .into_iter()
                .map(|id| index.entry(id).name.clone())
                .collect()
        };
        assert_eq!(
            answer(&full, &|id| !hidden(id)),
            answer(&visible_only, &|_| true),
            "query {probe:?}"
        );
    }
    assert!(probes.len() > 150);
}
