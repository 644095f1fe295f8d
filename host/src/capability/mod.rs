//! Routing a capability call (ADR-0047): the [`router`] picks one eligible provider per new
//! call, reading the key's cached view and the [`breaker`]s that every attempt feeds. The
//! capability itself (card, providers, mappings) is a catalog entry: `catalog::capability`.

pub mod breaker;
pub mod router;
