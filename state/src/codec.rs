//! How replicated data is encoded: log entries, Raft messages between replicas and the state machine's records.
//!
//! MessagePack with struct fields by position, behind a one-byte tag. JSON (the format before version 4) is
//! still read, so a data directory written by an older build opens and its records are rewritten as they change.
//!
//! Why MessagePack by position: JSON spent most of a replica's CPU per submission on field names and number
//! formatting (a job record is about 1.5 KB of JSON and about 200 bytes here). Evolution works the way it did
//! with JSON for the common case: a field added at the *end* of a struct with `#[serde(default)]` reads as its
//! default from older records. Removing or reordering fields needs a new `FORMAT_VERSION`, and no field may be
//! skipped when serializing (`skip_serializing_if`), since positions must line up; `encoded_field_positions_line_up`
//! below guards the types this crate writes. The reverse holds too (since feature level 2): a record with more
//! trailing fields than this build knows, written by a newer one, reads with the extra fields skipped
//! ([`crate::tolerant`]), so a rolled-back replica still follows the log.

use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

/// MessagePack's one never-used byte: no MessagePack value and no JSON text starts with it.
pub const BINARY_TAG: u8 = 0xC1;

#[derive(Debug, Error)]
pub enum CodecError {
    #[error("cannot decode a binary record: {0}")]
    Binary(#[from] rmp_serde::decode::Error),
    #[error("cannot decode a JSON record: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot encode a record: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
}

/// Encodes `value` in the current format.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(256);
    encode_into(value, &mut out)?;
    Ok(out)
}

/// Appends `value`, in the current format, to `out` (reusing its allocation).
pub fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
    out.push(BINARY_TAG);
    rmp_serde::encode::write(out, value)?;
    Ok(())
}

/// Decodes a record written by [`encode`], or by an older build as JSON.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.split_first() {
        Some((&BINARY_TAG, rest)) => {
            let mut reader = rmp_serde::Deserializer::from_read_ref(rest);
            Ok(T::deserialize(crate::tolerant::Tolerant(&mut reader))?)
        }
        _ => Ok(serde_json::from_slice(bytes)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::{Checkpoint, IncarnationRecord, NodeUsage};
    use crate::{Command, Job, JobSpec, JobState, MeasuredUsage, Request};

    fn busy_job() -> Job {
        let spec = JobSpec {
            name: "train".into(),
            user: "alice".into(),
            uid: 1000,
            environment: vec![("PATH".into(), "/usr/bin".into())].into(),
            stdout: Some("/tmp/o".into()),
            time_limit_s: Some(60),
            ..JobSpec::default()
        };
        Job {
            id: 42,
            spec,
            state: JobState::Running,
            nodes: vec!["n1".into(), "n2".into()].into(),
            checkpoint: Some(Box::new(Checkpoint { path: "/ck/1".into(), step: Some(3), incarnation: 1, time_ms: 5 })),
            history: vec![IncarnationRecord {
                incarnation: 0,
                start_ms: Some(1),
                end_ms: 2,
                nodes: "n[1-2]".into(),
                state: JobState::NodeFail,
                reason: "node n2 died".into(),
                resumed_from: None,
                gpus: 8,
                last_checkpoint_ms: None,
            }]
            .into(),
            node_usage: vec![NodeUsage {
                node: "n1".into(),
                usage: MeasuredUsage { cpu_ms: None, mem_peak_kb: Some(7) },
            }]
            .into(),
            ..Job::default()
        }
    }

    /// Optional and empty fields in the middle of a record keep their place: a value after them comes back as it
    /// went in (a field skipped when serializing would shift every later one).
    #[test]
    fn encoded_field_positions_line_up() {
        let job = busy_job();
        let bytes = encode(&job).unwrap();
        assert_eq!(bytes[0], BINARY_TAG);
        assert_eq!(decode::<Job>(&bytes).unwrap(), job);
        let empty = Job { id: 7, ..Job::default() };
        assert_eq!(decode::<Job>(&encode(&empty).unwrap()).unwrap(), empty);
        let command = Command::SubmitJob { spec: Box::new(job.spec.clone()), request_id: Some("r-1".into()) };
        let request = Request { time_ms: 1_700_000_000_000, command };
        let back: Request = decode(&encode(&request).unwrap()).unwrap();
        assert_eq!(back, request);
        let json = serde_json::to_vec(&job).unwrap();
        assert!(bytes.len() * 3 < json.len(), "binary {} bytes, JSON {} bytes", bytes.len(), json.len());
    }

    /// `busy_job` as the build before the compact job (3715b26: `String`s, `Vec`s, the checkpoint inline, the
    /// dropped goodput always present) encoded it.
    const BUSY_JOB_BEFORE_COMPACT: &str = "c1dc00222adc0031a5747261696ec0c0a5616c696365cd03e800a090a0a0a62f746d702f6fc00000c0c00000c03cc0c2a3416c6c9192a450415448a82f7573722f62696ec2c2c2909090c0c00090c2c0c0c0c0c2c0c0c0c0c0c0c0c0c2a0c0a752756e6e696e67a44e6f6e65c200c0c00000000092a26e31a26e32c090c09200009192a26e3192c0070090c0a0a0c09000c094a52f636b2f31030105a09199000102a66e5b312d325da84e6f64654661696cac6e6f6465206e322064696564c008c0009700000000000000";

    /// The compact in-memory job (inline short strings, one-word lists, rarely set parts boxed) changed the types,
    /// not the record: a record from the build before decodes to the same job, and the job encodes back to the
    /// same bytes. Only the dropped goodput, now optional, differs: old records carry it (zeros), and it decodes
    /// as present.
    #[test]
    fn records_of_the_build_before_the_compact_job_decode_and_encode_alike() {
        let old: Vec<u8> = (0..BUSY_JOB_BEFORE_COMPACT.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&BUSY_JOB_BEFORE_COMPACT[i..i + 2], 16).unwrap())
            .collect();
        let expected = Job { dropped_goodput: Some(Box::default()), ..busy_job() };
        assert_eq!(decode::<Job>(&old).unwrap(), expected);
        // Re-encoded, it is the old record with the fields added to the spec since then appended at the spec's
        // end (at their defaults), its array one longer for each: nothing before them moved. So adding a spec
        // field, as the append-only rule asks, needs no change here.
        // Fields appended to the job itself since then (`suspension: None`, `resilience: None`) add one byte each at
        // the record's end and one each to the job's field count.
        const JOB_FIELDS_ADDED: usize = 2;
        let now = encode(&expected).unwrap();
        let spec_now = encode(&expected.spec).unwrap();
        let fields_now = &spec_now[4..]; // after the tag and the array16 header
        let head = 5; // tag, the job's array16 header, its id
        assert_eq!(old[head..head + 3], [0xdc, 0, 49], "the old spec: an array of 49 fields");
        assert_eq!(now[head..head + 3], spec_now[1..4], "the spec's header now");
        let grown = now.len() - old.len() - JOB_FIELDS_ADDED;
        let fields_old = fields_now.len() - grown;
        assert_eq!((old[0], old[1], old[4]), (now[0], now[1], now[4]), "the tag, the array16 marker, the id");
        let count = |r: &[u8]| usize::from(u16::from_be_bytes([r[2], r[3]]));
        assert_eq!(count(&old) + JOB_FIELDS_ADDED, count(&now), "the job's fields, appended to");
        assert_eq!(old[head + 3..head + 3 + fields_old], fields_now[..fields_old], "the old fields, unmoved");
        let after_spec = &now[head + 3 + fields_now.len()..now.len() - JOB_FIELDS_ADDED];
        assert_eq!(old[head + 3 + fields_old..], *after_spec, "the job's fields after it");
        assert_eq!(now[now.len() - JOB_FIELDS_ADDED..], [0xc0, 0xc0], "the added fields, at their defaults");
        // A job that never overflowed its history now stores one byte (nil) for it instead of seven zeros.
        assert_eq!(encode(&busy_job()).unwrap().len() + 7, now.len());
    }

    /// Records written by builds before the binary format (JSON) still read.
    #[test]
    fn json_records_of_older_builds_still_decode() {
        let job = busy_job();
        let json = serde_json::to_vec(&job).unwrap();
        assert_eq!(decode::<Job>(&json).unwrap(), job);
        let err = decode::<Job>(&[BINARY_TAG, 0x92, 0x01]).unwrap_err();
        assert!(err.to_string().contains("binary record"), "{err}");
        let err = decode::<Job>(b"{\"id\": \"x\"").unwrap_err();
        assert!(err.to_string().contains("JSON record"), "{err}");
    }

    /// A newer build's shapes: each struct has a field more at its end than [`old`]'s, nested every way a record
    /// nests (a field, an option, a box, a list, a map value, an enum's struct and tuple variants).
    mod new {
        use serde::{Deserialize, Serialize};
        #[derive(Serialize, Deserialize)]
        pub struct Inner {
            pub a: u32,
            pub added: Vec<String>,
        }
        #[derive(Serialize, Deserialize)]
        pub enum Kind {
            Plain { x: u8, added: bool },
            Pair(u8, u8, Inner),
            Unit,
        }
        #[derive(Serialize, Deserialize)]
        pub struct Outer {
            pub inner: Inner,
            pub maybe: Option<Box<Inner>>,
            pub list: Vec<Inner>,
            pub map: std::collections::BTreeMap<String, Inner>,
            pub kinds: Vec<Kind>,
            pub tail: u64,
            pub added: Option<Inner>,
        }
    }
    mod old {
        use serde::Deserialize;
        #[derive(Debug, PartialEq, Deserialize)]
        pub struct Inner {
            pub a: u32,
        }
        #[derive(Debug, PartialEq, Deserialize)]
        pub enum Kind {
            Plain { x: u8 },
            Pair(u8, u8),
            Unit,
        }
        #[derive(Debug, PartialEq, Deserialize)]
        pub struct Outer {
            pub inner: Inner,
            pub maybe: Option<Box<Inner>>,
            pub list: Vec<Inner>,
            pub map: std::collections::BTreeMap<String, Inner>,
            pub kinds: Vec<Kind>,
            pub tail: u64,
        }
    }

    #[test]
    fn a_record_with_fields_from_a_newer_build_reads_with_them_skipped() {
        let inner = |a| new::Inner { a, added: vec!["x".into(); a as usize] };
        let newer = new::Outer {
            inner: inner(1),
            maybe: Some(Box::new(inner(2))),
            list: vec![inner(3), inner(4)],
            map: [("k".to_string(), inner(5))].into(),
            kinds: vec![new::Kind::Plain { x: 6, added: true }, new::Kind::Pair(7, 8, inner(9)), new::Kind::Unit],
            tail: 10,
            added: Some(inner(11)),
        };
        let bytes = encode(&newer).unwrap();
        // Without the wrapper the reader refuses it, as the build before feature level 2 does.
        let strict = rmp_serde::from_slice::<old::Outer>(&bytes[1..]).unwrap_err();
        assert!(strict.to_string().contains("length"), "{strict}");
        let read: old::Outer = decode(&bytes).unwrap();
        assert_eq!(
            read,
            old::Outer {
                inner: old::Inner { a: 1 },
                maybe: Some(Box::new(old::Inner { a: 2 })),
                list: vec![old::Inner { a: 3 }, old::Inner { a: 4 }],
                map: [("k".to_string(), old::Inner { a: 5 })].into(),
                kinds: vec![old::Kind::Plain { x: 6 }, old::Kind::Pair(7, 8), old::Kind::Unit],
                tail: 10,
            }
        );
    }

    #[test]
    fn a_record_missing_a_field_is_still_refused_unless_the_field_has_a_default() {
        #[derive(Serialize)]
        struct Short {
            a: u32,
        }
        let err = decode::<old::Outer>(&encode(&Short { a: 1 }).unwrap()).unwrap_err();
        assert!(err.to_string().contains("binary record"), "{err}");
        // A job of today's build still reads exactly (the wrapper changes nothing for records of the same shape).
        let job = busy_job();
        assert_eq!(decode::<Job>(&encode(&job).unwrap()).unwrap(), job);
    }
}
