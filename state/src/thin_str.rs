//! A string in one word: the job's optional and rarely set strings.
//!
//! A million pending jobs each carry about ten optional strings (output paths, GPU type, QOS, reservation,
//! comment...) that are nearly always unset. As `Option<Box<str>>` each costs two words inline even when unset;
//! as `Option<ThinStr>` it costs one, because the length lives on the heap beside the bytes. The always-empty
//! in-memory script (it is stored once, apart from the job) costs one word instead of three.
//!
//! It serializes exactly as a string does, so the replacement changes no record, message or log entry.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thin_vec::ThinVec;

/// An immutable UTF-8 string stored as one pointer to `[len, capacity, bytes]` (the empty string allocates
/// nothing). Reads deref to `&str`.
// Eq and Ord on the bytes agree with `str`'s; Hash is written by hand below, since a byte slice hashes differently
// from a `str` and `Borrow<str>` promises they agree.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ThinStr(ThinVec<u8>);

impl ThinStr {
    pub fn as_str(&self) -> &str {
        // SAFETY: every constructor copies the bytes of a `str`, and nothing mutates them afterwards, so they
        // are valid UTF-8.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }
}

impl Deref for ThinStr {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::hash::Hash for ThinStr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl AsRef<str> for ThinStr {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for ThinStr {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for ThinStr {
    fn from(s: &str) -> Self {
        ThinStr(ThinVec::from(s.as_bytes()))
    }
}

impl From<&String> for ThinStr {
    fn from(s: &String) -> Self {
        ThinStr::from(s.as_str())
    }
}

impl From<String> for ThinStr {
    fn from(s: String) -> Self {
        ThinStr::from(s.as_str())
    }
}

impl From<Box<str>> for ThinStr {
    fn from(s: Box<str>) -> Self {
        ThinStr::from(&*s)
    }
}

impl From<ThinStr> for String {
    fn from(s: ThinStr) -> Self {
        s.as_str().to_owned()
    }
}

impl PartialEq<str> for ThinStr {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ThinStr {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for ThinStr {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl fmt::Debug for ThinStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ThinStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl Serialize for ThinStr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ThinStr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl Visitor<'_> for StrVisitor {
            type Value = ThinStr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ThinStr, E> {
                Ok(ThinStr::from(v))
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<ThinStr, E> {
                std::str::from_utf8(v).map(ThinStr::from).map_err(|_| E::invalid_value(de::Unexpected::Bytes(v), &self))
            }
        }
        deserializer.deserialize_str(StrVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_optional_string_costs_one_word_and_a_set_one_reads_back_whole() {
        assert_eq!(std::mem::size_of::<Option<ThinStr>>(), std::mem::size_of::<usize>());
        let s = ThinStr::from("/scratch/out-%j.log");
        assert_eq!(&*s, "/scratch/out-%j.log");
        assert_eq!(s, "/scratch/out-%j.log");
        assert_eq!(format!("{s:?}"), format!("{:?}", "/scratch/out-%j.log"));
        assert!(ThinStr::default().is_empty());
    }

    #[test]
    fn a_map_keyed_by_it_is_found_by_a_plain_str() {
        let mut users = std::collections::HashMap::new();
        users.insert(ThinStr::from("alice"), 1000);
        assert_eq!(users.get("alice"), Some(&1000));
        let mut sorted = std::collections::BTreeSet::new();
        sorted.extend([ThinStr::from("b"), ThinStr::from("a")]);
        assert!(sorted.contains("a"));
        assert_eq!(sorted.iter().map(|s| s.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn it_encodes_exactly_as_a_boxed_str_in_both_record_formats() {
        let thin = Some(ThinStr::from("gpu-é"));
        let boxed: Option<Box<str>> = Some("gpu-é".into());
        assert_eq!(rmp_serde::to_vec(&thin).unwrap(), rmp_serde::to_vec(&boxed).unwrap());
        assert_eq!(serde_json::to_string(&thin).unwrap(), serde_json::to_string(&boxed).unwrap());
        let back: Option<ThinStr> = rmp_serde::from_slice(&rmp_serde::to_vec(&boxed).unwrap()).unwrap();
        assert_eq!(back, thin);
        let none: Option<ThinStr> = serde_json::from_str("null").unwrap();
        assert_eq!(none, None);
    }
}
