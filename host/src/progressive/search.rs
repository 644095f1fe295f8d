//! `search_tools` ranking (spec/mcp-gateway.md, "Progressive tools"): BM25 over a tool's
//! namespaced name (weighted up) and its description, with three things a model's query needs
//! that plain BM25 lacks: a query that is exactly a connector prefix surfaces that connector
//! first; words are matched through a small table of domain synonyms (a user says "money
//! back", the tool says "refund"); and a query word not in the index matches words one or two
//! edits away (typos). The index is built once per catalog snapshot; visibility is the
//! caller's filter, applied before ranking, so a hidden tool never influences what is shown.
//!
//! No ranking crate: the candidates (tantivy, a full search engine; fuzzy matchers that score
//! character runs, not words) either cost minutes of cold build on 2 cores or rank the wrong
//! thing; the whole of this is a few hundred lines and measured below.

use std::collections::HashMap;

/// One searchable tool.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub description: String,
}

/// The inverted index of one catalog snapshot.
#[derive(Debug, Default)]
pub struct Index {
    entries: Vec<Entry>,
    /// Connector prefix of each entry.
    prefixes: Vec<String>,
    /// term -> (entry, weighted term frequency)
    postings: HashMap<String, Vec<(u32, f32)>>,
    /// Weighted length of each entry, for BM25's length normalisation.
    lengths: Vec<f32>,
}

/// Name words count this many times a description word.
const NAME_WEIGHT: f32 = 3.0;
const K1: f32 = 1.2;
const B: f32 = 0.75;
/// A synonym or a typo correction counts this much of an exact word.
const SYNONYM_WEIGHT: f32 = 0.7;
const TYPO_WEIGHT: f32 = 0.8;
/// Far above any BM25 score: the prefix match wins.
const PREFIX_BOOST: f32 = 1000.0;

const STOPWORDS: [&str; 32] = [
    "a", "an", "the", "of", "to", "in", "on", "for", "and", "or", "with", "by", "from", "at", "is",
    "it", "its", "this", "that", "be", "as", "i", "me", "my", "we", "our", "you", "your", "can",
    "want", "please", "into",
];

/// Words a user may say for the words tools use (both directions are looked up).
const SYNONYMS: [(&str, &[&str]); 37] = [
    ("draft", &["write", "compose", "unsent"]),
    ("balance", &["funds", "money", "available"]),
    ("signature", &["sign", "esign", "signing"]),
    ("refund", &["reimburse", "money", "return", "chargeback"]),
    ("charge", &["payment", "pay", "bill", "transaction"]),
    ("invoice", &["bill", "billing", "receipt"]),
    ("customer", &["client", "buyer", "payer"]),
    ("subscription", &["plan", "recurring", "membership"]),
    ("issue", &["ticket", "bug", "task", "problem"]),
    ("pull", &["merge", "pr"]),
    ("comment", &["reply", "note", "remark"]),
    ("message", &["chat", "post", "dm", "text"]),
    ("channel", &["room", "conversation"]),
    ("event", &["meeting", "appointment", "calendar", "invite"]),
    ("schedule", &["book", "plan", "arrange"]),
    ("file", &["document", "doc", "attachment"]),
    ("folder", &["directory", "dir"]),
    ("upload", &["store", "put", "save"]),
    ("download", &["fetch", "retrieve", "get"]),
    ("delete", &["remove", "erase", "drop", "destroy", "trash"]),
    ("create", &["make", "new", "add", "open", "start"]),
    ("list", &["show", "all", "browse", "enumerate"]),
    ("search", &["find", "lookup", "query", "look"]),
    ("update", &["edit", "change", "modify", "rename"]),
    ("close", &["resolve", "finish", "done", "complete"]),
    ("send", &["email", "mail", "notify", "deliver"]),
    ("email", &["mail", "inbox", "message"]),
    ("contact", &["person", "people", "lead"]),
    ("deal", &["opportunity", "sale"]),
    ("user", &["member", "account", "person"]),
    ("repository", &["repo", "project", "codebase"]),
    ("cancel", &["stop", "terminate", "end"]),
    ("get", &["read", "view", "see", "details", "fetch"]),
    ("assign", &["give", "delegate"]),
    ("label", &["tag", "category"]),
    ("page", &["wiki", "doc", "article"]),
    ("share", &["link", "invite", "permission"]),
];

/// Lowercase words of a text: split on everything that is not a letter or digit, and on
/// camelCase boundaries; stopwords dropped; a light stemmer folds plurals and -ing/-ed.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for c in text.chars() {
        if c.is_alphanumeric() {
            if c.is_uppercase() && previous_lower {
                push_word(&mut out, &mut current);
            }
            previous_lower = c.is_lowercase();
            current.extend(c.to_lowercase());
        } else {
            previous_lower = false;
            push_word(&mut out, &mut current);
        }
    }
    push_word(&mut out, &mut current);
    out
}

fn push_word(out: &mut Vec<String>, current: &mut String) {
    if !current.is_empty() && !STOPWORDS.contains(&current.as_str()) {
        out.push(stem(current));
    }
    current.clear();
}

fn stem(word: &str) -> String {
    let strip = |suffix: &str, keep: usize| {
        word.strip_suffix(suffix)
            .filter(|rest| rest.len() >= keep)
            .map(str::to_owned)
    };
    strip("ies", 3)
        .map(|rest| rest + "y")
        .or_else(|| strip("ing", 4))
        .or_else(|| strip("ed", 4))
        .or_else(|| strip("es", 4).filter(|r| r.ends_with(['s', 'x', 'h'])))
        .or_else(|| strip("s", 3).filter(|r| !r.ends_with('s')))
        .unwrap_or_else(|| word.to_owned())
}

/// Levenshtein distance, stopping once it exceeds `limit`.
fn within(a: &str, b: &str, limit: usize) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len().abs_diff(b.len()) > limit {
        return false;
    }
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        let mut best = row[0];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous + usize::from(ca != cb);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
            best = best.min(row[j + 1]);
        }
        if best > limit {
            return false;
        }
    }
    row[b.len()] <= limit
}

impl Index {
    pub fn build(entries: Vec<Entry>) -> Index {
        let mut postings: HashMap<String, HashMap<u32, f32>> = HashMap::new();
        let mut lengths = Vec::with_capacity(entries.len());
        let mut prefixes = Vec::with_capacity(entries.len());
        for (id, entry) in entries.iter().enumerate() {
            let id = u32::try_from(id).expect("fewer than 4 billion tools");
            prefixes.push(
                entry
                    .name
                    .split_once('.')
                    .map_or(entry.name.as_str(), |(prefix, _)| prefix)
                    .to_lowercase(),
            );
            let mut length = 0.0;
            for (text, weight) in [(&entry.name, NAME_WEIGHT), (&entry.description, 1.0)] {
                for word in words(text) {
                    *postings.entry(word).or_default().entry(id).or_default() += weight;
                    length += weight;
                }
            }
            lengths.push(length);
        }
        Index {
            entries,
            prefixes,
            postings: postings
                .into_iter()
                .map(|(word, hits)| (word, hits.into_iter().collect()))
                .collect(),
            lengths,
        }
    }

    pub fn entry(&self, id: usize) -> &Entry {
        &self.entries[id]
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether any entry the caller may see has `word`.
    fn seen(&self, word: &str, visible: &impl Fn(usize) -> bool) -> bool {
        self.postings
            .get(word)
            .is_some_and(|hits| hits.iter().any(|&(id, _)| visible(id as usize)))
    }

    /// The weighted terms a query stands for: its own words, their synonyms, and for a word
    /// no visible entry has, the visible entries' words one (or, for long words, two) edits
    /// away. Only visible entries count: whether a word is known must not depend on a hidden
    /// tool. In a fixed order, so that scores are summed alike every time.
    fn expand(
        &self,
        query: &str,
        visible: &impl Fn(usize) -> bool,
    ) -> std::collections::BTreeMap<String, f32> {
        let mut terms = std::collections::BTreeMap::<String, f32>::new();
        let mut add = |term: String, weight: f32| {
            let slot = terms.entry(term).or_default();
            *slot = slot.max(weight);
        };
        for word in words(query) {
            let known = self.seen(&word, visible);
            if !known && word.chars().count() >= 4 {
                // Only the closest corrections: a word one edit away beats every word two away.
                let longest = if word.chars().count() >= 8 { 2 } else { 1 };
                for limit in 1..=longest {
                    let mut near: Vec<&String> = self
                        .postings
                        .keys()
                        .filter(|indexed| {
                            within(&word, indexed, limit) && self.seen(indexed, visible)
                        })
                        .collect();
                    near.sort();
                    if !near.is_empty() {
                        for indexed in near {
                            add(indexed.clone(), TYPO_WEIGHT);
                        }
                        break;
                    }
                }
            }
            for (canonical, others) in SYNONYMS {
                let canonical = stem(canonical);
                let others: Vec<String> = others.iter().map(|o| stem(o)).collect();
                if word == canonical {
                    for other in others {
                        add(other, SYNONYM_WEIGHT);
                    }
                } else if others.contains(&word) {
                    add(canonical, SYNONYM_WEIGHT);
                }
            }
            add(word, 1.0);
        }
        terms
    }

    /// Up to `limit` entries the caller may show, best first. Every statistic (the entry
    /// count, document frequencies, the average length, which words are known) is taken over
    /// the visible entries only, so a hidden entry cannot change the answer in any way: the
    /// answer is the one an index of the visible entries alone would give.
    pub fn search(&self, query: &str, visible: impl Fn(usize) -> bool, limit: usize) -> Vec<usize> {
        let (mut count, mut total) = (0usize, 0.0f32);
        for (id, length) in self.lengths.iter().enumerate() {
            if visible(id) {
                count += 1;
                total += length;
            }
        }
        let n = count as f32;
        let average_length = total / count.max(1) as f32;
        let mut scores: HashMap<u32, f32> = HashMap::new();
        for (term, weight) in self.expand(query, &visible) {
            let Some(hits) = self.postings.get(&term) else {
                continue;
            };
            let seen: Vec<(u32, f32)> = hits
                .iter()
                .copied()
                .filter(|&(id, _)| visible(id as usize))
                .collect();
            let df = seen.len() as f32;
            let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
            for (id, tf) in seen {
                let norm = K1 * (1.0 - B + B * self.lengths[id as usize] / average_length);
                *scores.entry(id).or_default() += weight * idf * tf * (K1 + 1.0) / (tf + norm);
            }
        }
        let whole = query.trim().to_lowercase();
        if !whole.is_empty() {
            for (id, prefix) in self.prefixes.iter().enumerate() {
                if *prefix == whole {
                    *scores.entry(id as u32).or_default() += PREFIX_BOOST;
                }
            }
        }
        let mut ranked: Vec<(u32, f32)> = scores
            .into_iter()
            .filter(|(id, _)| visible(*id as usize))
            .collect();
        // Ties broken by name, so the same query always answers the same list.
        ranked.sort_by(|a, b| {
            b.1.total_cmp(&a.1).then_with(|| {
                self.entries[a.0 as usize]
                    .name
                    .cmp(&self.entries[b.0 as usize].name)
            })
        });
        ranked
            .into_iter()
            .take(limit)
            .map(|(id, _)| id as usize)
            .collect()
    }
}

#[cfg(test)]
mod tests;
