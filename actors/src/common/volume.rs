//! How a broker tells the others its data volume is full (ADR 0111): a
//! membership attribute, named here because membership (`fabric`) keeps it
//! and placement (`control`) reads it, and neither may name `data`.

/// The membership attribute a broker whose volume is full carries, so that
/// coordinators place no new copies on it and move its active segments.
pub(crate) const STORAGE_ATTRIBUTE: &str = "malachi.storage";
/// Its value while full; the attribute is absent otherwise.
pub(crate) const STORAGE_FULL: &str = "full";

/// Whether a broker with these membership attributes has room for copies.
pub(crate) fn has_room(attributes: &std::collections::BTreeMap<String, String>) -> bool {
    attributes.get(STORAGE_ATTRIBUTE).map(String::as_str) != Some(STORAGE_FULL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_full_mark_takes_a_broker_out_of_placement() {
        let mut attributes = std::collections::BTreeMap::new();
        assert!(has_room(&attributes));
        attributes.insert("zone".to_owned(), "a".to_owned());
        attributes.insert(STORAGE_ATTRIBUTE.to_owned(), "ok".to_owned());
        assert!(has_room(&attributes));
        attributes.insert(STORAGE_ATTRIBUTE.to_owned(), STORAGE_FULL.to_owned());
        assert!(!has_room(&attributes));
    }
}
