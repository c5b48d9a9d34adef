//! Canonical JSON (RFC 8785) and the values derived from it: input hashes, idempotency keys and
//! redaction hashes. Key order and number spelling never change a hash; any value change does.

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

mod ser;

pub use ser::{Error as CanonError, canonical_of};

/// The RFC 8785 canonical form of a JSON value.
///
/// Written directly rather than through `serde_json_canonicalizer`, which allocates a UTF-16
/// copy of every key: the audit chain canonicalises every record it appends, and that was the
/// largest single cost of an append. Numbers other than integers that are exact as doubles
/// still go through `serde_json_canonicalizer` (ECMAScript number formatting); a property test
/// holds the two to the same bytes.
pub fn canonical(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write_canonical(value, &mut out);
    out
}

/// Integers up to 2^53 are exact as doubles and print as plain digits.
const EXACT: u64 = 1 << 53;

fn write_canonical(v: &Value, out: &mut String) {
    use std::fmt::Write as _;
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) if i.unsigned_abs() <= EXACT => {
                let _ = write!(out, "{i}");
            }
            (_, Some(u)) if u <= EXACT => {
                let _ = write!(out, "{u}");
            }
            _ => out.push_str(
                &serde_json_canonicalizer::to_string(v).expect("a JSON number canonicalises"),
            ),
        },
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| key_order(a.0, b.0));
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(k, out);
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

/// The order of an object's keys: by UTF-16 code units (RFC 8785 §3.2.3), which differs from
/// UTF-8 byte order only for characters above U+FFFF.
fn key_order(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() {
        a.cmp(b)
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

/// A string as ECMAScript's `JSON.stringify` writes it (RFC 8785 §3.2.2.2): `"` and `\`
/// escaped, the five control characters with short escapes as such, the other control
/// characters as `\u00xx`, everything else as it is. Scanned by byte: every byte that needs an
/// escape is ASCII, and no byte of a multi-byte character is.
fn write_str(s: &str, out: &mut String) {
    use std::fmt::Write as _;
    out.push('"');
    let mut start = 0;
    for (i, &b) in s.as_bytes().iter().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..0x20 => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(esc);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

macro_rules! hash_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Wraps a value already in `sha256:<hex>` form (read back from storage).
            pub fn from_stored(s: impl Into<String>) -> Self {
                $name(s.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

hash_newtype!(
    /// `sha256:<hex>` of the canonical inputs of a call: what an approval binds to.
    InputHash
);
hash_newtype!(
    /// A derived idempotency key. Never minted at random, never chosen by the model.
    IdempotencyKey
);

impl InputHash {
    /// Hashes the canonical form of `inputs`.
    pub fn of(inputs: &Value) -> Self {
        let digest = Sha256::digest(canonical(inputs).as_bytes());
        InputHash(format!("sha256:{}", hex::encode(digest)))
    }
}

impl IdempotencyKey {
    /// The key of a planned step: the run, the step's position in the plan and its inputs.
    /// A re-planned step with different inputs gets a different key; a retry gets the same one.
    pub fn for_step(run_id: &str, seq: u32, inputs: &Value) -> Self {
        let canon = canonical(inputs);
        IdempotencyKey(format!(
            "sha256:{}",
            sha256_hex(&[
                b"toolgate/step/v1",
                run_id.as_bytes(),
                &seq.to_be_bytes(),
                canon.as_bytes()
            ])
        ))
    }

    /// The key of a direct call: the scope it is derived in (a principal, its tree or the
    /// registry; see `Registry::key_scope`), the tool and only the fields that identify the
    /// operation, so rewording free text on a retry does not change the key. A tool without
    /// declared identity fields is identified by all of its inputs. Never a session or a run:
    /// the same operation retried from any connection has the same key.
    pub fn for_call(scope: &str, tool: &str, identity: &[String], inputs: &Value) -> Self {
        let identified = identity_subset(identity, inputs);
        let canon = canonical(&identified);
        IdempotencyKey(format!(
            "sha256:{}",
            sha256_hex(&[
                b"toolgate/call/v2",
                scope.as_bytes(),
                tool.as_bytes(),
                canon.as_bytes()
            ])
        ))
    }
}

/// The object made of only the identity fields of `inputs` (absent fields are `null`).
pub fn identity_subset(identity: &[String], inputs: &Value) -> Value {
    if identity.is_empty() {
        return inputs.clone();
    }
    let mut out = serde_json::Map::new();
    for field in identity {
        let v = lookup_path(inputs, field).cloned().unwrap_or(Value::Null);
        out.insert(field.clone(), v);
    }
    Value::Object(out)
}

/// Follows a dotted path (`supplier.iban`) into a JSON value.
pub fn lookup_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, seg| v.get(seg))
}

/// Keyed hashing of the fields a tool marks as sensitive. Two redacted IBANs that are equal
/// produce the same hash, so a reviewer can still see "same account as last time". Each hash
/// names the key it was made with (`hmac:<key id>:…`), so after the key rotates nobody takes
/// two hashes of the same value under different keys for two different values, or the reverse.
#[derive(Clone)]
pub struct Redactor {
    id: String,
    key: Vec<u8>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({})", self.id)
    }
}

/// The development redaction key: public, in this source file. Only `--dev` and tests use it,
/// and every hash made with it says so (`hmac:dev:…`).
const DEV_REDACTION_KEY: &[u8] = b"toolgate-development-redaction-key (public: see docs/keys.md)";

impl Redactor {
    /// A redactor with `key`; its id is a fingerprint of the key (8 hex digits), which says
    /// nothing about the key but tells hashes made with different keys apart.
    pub fn new(key: impl Into<Vec<u8>>) -> Self {
        let key = key.into();
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&key).expect("HMAC takes any key size");
        mac.update(b"toolgate redaction key id");
        let id = hex::encode(&mac.finalize().into_bytes()[..4]);
        Redactor { id, key }
    }

    /// The development key, which anyone can read: a low-entropy value hashed with it (an
    /// IBAN, an email address) can be recovered by hashing guesses. Its id is `dev`.
    pub fn dev() -> Self {
        Redactor {
            id: "dev".to_string(),
            key: DEV_REDACTION_KEY.to_vec(),
        }
    }

    /// The id every hash made by this redactor carries.
    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// The keyed hash that replaces a redacted value: `hmac:<key id>:<first 16 bytes hex>`.
    pub fn hash(&self, value: &Value) -> String {
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).expect("HMAC takes any key size");
        mac.update(canonical(value).as_bytes());
        let out = mac.finalize().into_bytes();
        format!("hmac:{}:{}", self.id, hex::encode(&out[..16]))
    }

    /// Returns `value` with each listed path replaced by its keyed hash, and the paths that were
    /// present (and so redacted).
    pub fn redact(&self, value: &Value, paths: &[String]) -> (Value, Vec<String>) {
        let mut out = value.clone();
        let mut done = Vec::new();
        for path in paths {
            if redact_path(&mut out, path, &|v| Value::String(self.hash(v))) {
                done.push(path.clone());
            }
        }
        (out, done)
    }
}

fn redact_path(value: &mut Value, path: &str, f: &dyn Fn(&Value) -> Value) -> bool {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    match value {
        Value::Object(map) => match (map.get_mut(head), rest) {
            (Some(v), None) => {
                *v = f(v);
                true
            }
            (Some(v), Some(rest)) => redact_path(v, rest, f),
            (None, _) => false,
        },
        // A list of records: redact the field in each.
        Value::Array(items) => {
            let mut any = false;
            for item in items {
                any |= redact_path(item, path, f);
            }
            any
        }
        _ => false,
    }
}

/// `sha256:<hex>` of arbitrary bytes; the hash used by the audit chain and the lockfile.
pub fn sha256_tagged(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(bytes);
    format!("sha256:{}", hex::encode(h.finalize()))
}

#[cfg(test)]
#[path = "canon_tests.rs"]
mod tests;
