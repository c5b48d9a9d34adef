//! Signed checkpoints of the audit chain. The chain shows that no record was edited, but not
//! where it ends: whoever can write the database can delete the newest records and move the
//! head back. A checkpoint is the head (store, record number, hash, time) signed with an Ed25519
//! key kept away from the database; kept away from it too, it lets `log verify` show that the
//! chain still reaches that record with that hash, as signed tree heads do for Certificate
//! Transparency logs. The design note is `docs/audit-chain.md`.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use toolgate_core::canon::sha256_tagged;
use toolgate_core::{Timestamp, canonical};

use crate::Store;
use crate::audit::{self, AuditRecord, BrokenLink, ChainPoint, ChainReport};
use crate::error::{Result, StoreError};

/// What a signature covers ahead of the statement's canonical JSON, so that a signature made
/// for a checkpoint can never be read as one over anything else.
const SIGNING_CONTEXT: &[u8] = b"toolgate audit checkpoint v1\n";

/// The version of the checkpoint statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointFormat {
    #[serde(rename = "toolgate-audit-checkpoint/1")]
    V1,
}

/// A key's id: the first 16 hex digits of the SHA-256 of its public key (DER
/// SubjectPublicKeyInfo), as Certificate Transparency names a log by its key's hash. Derived,
/// never chosen, so two keys cannot share one by mistake, and a new key is a new id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeyId(String);

impl KeyId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A public key that verifies checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPublicKey {
    key: VerifyingKey,
    id: KeyId,
}

impl CheckpointPublicKey {
    fn new(key: VerifyingKey) -> CheckpointPublicKey {
        let der = key
            .to_public_key_der()
            .expect("an Ed25519 public key encodes as DER");
        let hash = sha256_tagged(der.as_bytes());
        let id = KeyId(hash["sha256:".len().."sha256:".len() + 16].to_string());
        CheckpointPublicKey { key, id }
    }

    pub fn id(&self) -> &KeyId {
        &self.id
    }

    /// PEM (`PUBLIC KEY`, SubjectPublicKeyInfo), as `openssl pkey -pubout` writes it.
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .expect("an Ed25519 public key encodes as PEM")
    }

    /// Every public key in `text`: PEM `PUBLIC KEY` blocks, with anything between them (a
    /// keyring's comments) ignored. `origin` names where the text came from, for errors.
    pub fn parse_all(text: &str, origin: &str) -> Result<Vec<CheckpointPublicKey>> {
        let bad = |problem: String| StoreError::CheckpointPublicKey {
            origin: origin.to_string(),
            problem,
        };
        let mut keys = Vec::new();
        for block in pem_blocks(text) {
            match block.label {
                "PUBLIC KEY" => {
                    let key = VerifyingKey::from_public_key_pem(block.text)
                        .map_err(|e| bad(format!("a PUBLIC KEY block does not decode: {e}")))?;
                    keys.push(CheckpointPublicKey::new(key));
                }
                "PRIVATE KEY" => {
                    return Err(bad(
                        "it holds a private key; give verifiers the public key only".into(),
                    ));
                }
                other => return Err(bad(format!("unexpected PEM block '{other}'"))),
            }
        }
        if keys.is_empty() {
            return Err(bad(
                "no '-----BEGIN PUBLIC KEY-----' block in it (an Ed25519 key in PEM)".into(),
            ));
        }
        Ok(keys)
    }
}

/// One `-----BEGIN label----- … -----END label-----` block.
struct PemBlock<'a> {
    label: &'a str,
    text: &'a str,
}

fn pem_blocks(text: &str) -> Vec<PemBlock<'_>> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let from = &rest[start..];
        let label_end = from["-----BEGIN ".len()..]
            .find("-----")
            .map(|i| i + "-----BEGIN ".len());
        let Some(label_end) = label_end else { break };
        let label = &from["-----BEGIN ".len()..label_end];
        let end_marker = format!("-----END {label}-----");
        let Some(end) = from.find(&end_marker) else {
            blocks.push(PemBlock { label, text: from });
            break;
        };
        let block_len = end + end_marker.len();
        blocks.push(PemBlock {
            label,
            text: &from[..block_len],
        });
        rest = &from[block_len..];
    }
    blocks
}

/// The key that signs checkpoints. Its `Debug` shows the key id only.
pub struct CheckpointSigner {
    key: SigningKey,
    public: CheckpointPublicKey,
}

impl std::fmt::Debug for CheckpointSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CheckpointSigner({})", self.public.id)
    }
}

impl CheckpointSigner {
    /// A new key from the operating system's random source.
    pub fn generate() -> Result<CheckpointSigner> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(StoreError::Random)?;
        Ok(CheckpointSigner::from_key(SigningKey::from_bytes(&secret)))
    }

    fn from_key(key: SigningKey) -> CheckpointSigner {
        let public = CheckpointPublicKey::new(key.verifying_key());
        CheckpointSigner { key, public }
    }

    /// Reads a PKCS#8 key: PEM (`PRIVATE KEY`, as `openssl genpkey -algorithm ed25519` writes
    /// it), or the base64 between its armour lines on one line (for an environment variable).
    pub fn parse(text: &str, origin: &str) -> Result<CheckpointSigner> {
        let bad = |problem: String| StoreError::CheckpointKey {
            origin: origin.to_string(),
            problem,
        };
        let text = text.trim();
        let key = if text.starts_with("-----BEGIN ") {
            let blocks = pem_blocks(text);
            match blocks.as_slice() {
                [b] if b.label == "PRIVATE KEY" => SigningKey::from_pkcs8_pem(b.text)
                    .map_err(|e| bad(format!("the PRIVATE KEY block does not decode: {e}")))?,
                [b] if b.label == "PUBLIC KEY" => {
                    return Err(bad(
                        "it is a public key; signing needs the private key".into()
                    ));
                }
                _ => {
                    return Err(bad(
                        "expected one '-----BEGIN PRIVATE KEY-----' block (Ed25519, PKCS#8)".into(),
                    ));
                }
            }
        } else {
            let der = B64.decode(text).map_err(|e| {
                bad(format!(
                    "neither PEM nor one line of base64 (PKCS#8 DER): {e}"
                ))
            })?;
            SigningKey::from_pkcs8_der(&der)
                .map_err(|e| bad(format!("the base64 is not an Ed25519 PKCS#8 key: {e}")))?
        };
        Ok(CheckpointSigner::from_key(key))
    }

    /// PEM (`PRIVATE KEY`, PKCS#8).
    pub fn to_pem(&self) -> String {
        self.key
            .to_pkcs8_pem(LineEnding::LF)
            .expect("an Ed25519 key encodes as PKCS#8 PEM")
            .to_string()
    }

    pub fn public_key(&self) -> &CheckpointPublicKey {
        &self.public
    }

    /// Signs the statement that `head` was the head of store `store`'s chain at `at`.
    pub fn sign(&self, store: &str, head: &ChainPoint, at: Timestamp) -> SignedCheckpoint {
        let mut cp = SignedCheckpoint {
            format: CheckpointFormat::V1,
            store: store.to_string(),
            seq: head.seq,
            hash: head.hash.clone(),
            signed_at: rfc3339(at),
            key_id: self.public.id.clone(),
            signature: String::new(),
        };
        let signature: Signature = self.key.sign(&cp.signed_bytes());
        cp.signature = B64.encode(signature.to_bytes());
        cp
    }
}

/// `2026-11-15T09:30:00.000Z`.
fn rfc3339(at: Timestamp) -> String {
    at.to_rfc3339_millis()
}

/// A signed statement of the chain head: in store `store`, record `seq` was the last and
/// hashed to `hash`, at `signed_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedCheckpoint {
    pub format: CheckpointFormat,
    /// The store's identity ([`Store::store_id`]), never its URL.
    pub store: String,
    pub seq: i64,
    pub hash: String,
    /// RFC 3339, UTC, milliseconds.
    pub signed_at: String,
    pub key_id: KeyId,
    /// Ed25519 over the context line and the canonical JSON (RFC 8785) of every other field;
    /// base64.
    pub signature: String,
}

impl SignedCheckpoint {
    fn signed_bytes(&self) -> Vec<u8> {
        let mut statement = serde_json::to_value(self).expect("checkpoints serialise");
        if let Some(fields) = statement.as_object_mut() {
            fields.remove("signature");
        }
        [SIGNING_CONTEXT, canonical(&statement).as_bytes()].concat()
    }

    /// One line of JSON (canonical), as a checkpoint file holds it.
    pub fn to_line(&self) -> String {
        toolgate_core::canon::canonical_of(self).expect("checkpoints serialise")
    }

    /// The record it names.
    pub fn head(&self) -> ChainPoint {
        ChainPoint {
            seq: self.seq,
            hash: self.hash.clone(),
        }
    }

    /// Checks the signature with the key its `key_id` names among `keys`: `None` if it
    /// verifies, the fault if not; an error if no key given has that id.
    pub fn check_signature(&self, keys: &[CheckpointPublicKey]) -> Result<Option<CheckpointFault>> {
        let Some(key) = keys.iter().find(|k| k.id == self.key_id) else {
            let known: Vec<&str> = keys.iter().map(|k| k.id.as_str()).collect();
            return Err(StoreError::CheckpointKeyUnknown {
                seq: self.seq,
                key_id: self.key_id.to_string(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            });
        };
        let bad = Some(CheckpointFault::BadSignature {
            key_id: self.key_id.clone(),
        });
        let Ok(bytes) = B64.decode(&self.signature) else {
            return Ok(bad);
        };
        let Ok(signature) = Signature::from_slice(&bytes) else {
            return Ok(bad);
        };
        Ok(match key.key.verify(&self.signed_bytes(), &signature) {
            Ok(()) => None,
            Err(_) => bad,
        })
    }
}

/// The checkpoints in a file: one JSON object per line (as `log checkpoint` appends them), or
/// one JSON object over several lines. Blank lines are skipped; `origin` names the file.
pub fn read_checkpoints(text: &str, origin: &str) -> Result<Vec<SignedCheckpoint>> {
    let bad = |problem: String| StoreError::CheckpointUnreadable {
        origin: origin.to_string(),
        problem,
    };
    if let Ok(one) = serde_json::from_str::<SignedCheckpoint>(text) {
        return Ok(vec![one]);
    }
    let mut checkpoints = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let cp = serde_json::from_str::<SignedCheckpoint>(line)
            .map_err(|e| bad(format!("line {}: {e}", i + 1)))?;
        checkpoints.push(cp);
    }
    if checkpoints.is_empty() {
        return Err(bad("it holds no checkpoint".into()));
    }
    Ok(checkpoints)
}

/// Why a checkpoint does not hold against the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CheckpointFault {
    #[error("its signature does not verify with key {key_id}: the checkpoint was edited or forged")]
    BadSignature { key_id: KeyId },
    #[error(
        "it is a checkpoint of store {checkpoint}, and this is store {this}: the wrong \
         database, or one rebuilt from nothing"
    )]
    OtherStore { checkpoint: String, this: String },
    #[error(
        "the chain ends at record {last_seq}, but the checkpoint says record {seq} existed: \
         records after {last_seq} were removed"
    )]
    Truncated { seq: i64, last_seq: i64 },
    #[error(
        "record {seq} hashes to {stored} but the checkpoint says {signed}: the chain was \
         rewritten at or before record {seq}"
    )]
    Rewritten {
        seq: i64,
        stored: String,
        signed: String,
    },
    #[error("the chain breaks at record {broken_at} before reaching record {seq}")]
    Unreached { seq: i64, broken_at: i64 },
}

/// One checkpoint, checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointCheck {
    pub checkpoint: SignedCheckpoint,
    /// `None`: the chain still reaches its record, with its hash.
    pub fault: Option<CheckpointFault>,
}

/// The chain, walked, and each checkpoint against it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointReport {
    pub chain: ChainReport,
    pub checks: Vec<CheckpointCheck>,
}

impl CheckpointReport {
    /// The chain is intact and reaches every checkpoint.
    pub fn is_intact(&self) -> bool {
        self.chain.is_intact() && self.checks.iter().all(|c| c.fault.is_none())
    }

    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| c.fault.is_some()).count()
    }
}

/// What [`Store::checkpoint`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointOutcome {
    Signed(SignedCheckpoint),
    /// Nothing was signed.
    Refused(CheckpointRefusal),
}

/// Why a head was not signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointRefusal {
    #[error("the audit chain is empty: there is no head to sign yet")]
    Empty,
    #[error("the audit chain is broken at record {}: {}", .0.seq, .0.reason)]
    Broken(BrokenLink),
    #[error(
        "the chain does not extend the last checkpoint (record {}, signed {}): {fault}",
        .since.seq, .since.signed_at
    )]
    Since {
        since: Box<SignedCheckpoint>,
        fault: CheckpointFault,
    },
}

impl Store {
    /// The store's identity, which every checkpoint of its chain names: made at random when
    /// the database was created, and never changed.
    pub async fn store_id(&self) -> Result<String> {
        let mut c = self.inner.pool.conn().await?;
        crate::audit::store_id(&mut c).await
    }

    /// Signs the chain head at `now` after checking the chain: all of it or, given the last
    /// checkpoint made (`since`), the records from that checkpoint's on, which must still end
    /// in the hash it signed. Never signs the head of a broken chain, nor one that does not
    /// extend `since`: what was signed once stays signed.
    pub async fn checkpoint(
        &self,
        signer: &CheckpointSigner,
        now: Timestamp,
        since: Option<&SignedCheckpoint>,
    ) -> Result<CheckpointOutcome> {
        let store = self.store_id().await?;
        let mut c = self.inner.pool.conn().await?;
        let refuse = |since: &SignedCheckpoint, fault| {
            Ok(CheckpointOutcome::Refused(CheckpointRefusal::Since {
                since: Box::new(since.clone()),
                fault,
            }))
        };
        let walk = match since {
            None => audit::walk(&mut c, &ChainPoint::genesis(), &BTreeSet::new()).await?,
            Some(since) => {
                if since.store != store {
                    let fault = CheckpointFault::OtherStore {
                        checkpoint: since.store.clone(),
                        this: store,
                    };
                    return refuse(since, fault);
                }
                let Some(text) = audit::record_text_at(&mut c, since.seq).await? else {
                    let last_seq = audit::read_head(&mut c).await?.seq;
                    let fault = CheckpointFault::Truncated {
                        seq: since.seq,
                        last_seq,
                    };
                    return refuse(since, fault);
                };
                // From the record before it, whose hash the record itself states: the walk
                // then checks the record's own hash as well as everything after it (and
                // names an unreadable record as such).
                let prev = serde_json::from_str::<AuditRecord>(&text)
                    .map(|r| r.prev)
                    .unwrap_or_default();
                let from = ChainPoint {
                    seq: since.seq - 1,
                    hash: prev,
                };
                let walk = audit::walk(&mut c, &from, &BTreeSet::from([since.seq])).await?;
                if let Some(stored) = walk.watched.get(&since.seq)
                    && *stored != since.hash
                {
                    let fault = CheckpointFault::Rewritten {
                        seq: since.seq,
                        stored: stored.clone(),
                        signed: since.hash.clone(),
                    };
                    return refuse(since, fault);
                }
                walk
            }
        };
        if let Some(link) = walk.report.broken {
            return Ok(CheckpointOutcome::Refused(CheckpointRefusal::Broken(link)));
        }
        if walk.last.seq == 0 {
            return Ok(CheckpointOutcome::Refused(CheckpointRefusal::Empty));
        }
        Ok(CheckpointOutcome::Signed(
            signer.sign(&store, &walk.last, now),
        ))
    }

    /// Walks the whole chain and checks each checkpoint against it: its signature (with the
    /// key its id names among `keys`), its store, and that the chain still reaches its record
    /// with the hash it signed. An error if a checkpoint's key is not among `keys`.
    pub async fn verify_checkpoints(
        &self,
        checkpoints: &[SignedCheckpoint],
        keys: &[CheckpointPublicKey],
    ) -> Result<CheckpointReport> {
        let store = self.store_id().await?;
        let mut faults = Vec::with_capacity(checkpoints.len());
        for cp in checkpoints {
            let fault = match cp.check_signature(keys)? {
                Some(fault) => Some(fault),
                None if cp.store != store => Some(CheckpointFault::OtherStore {
                    checkpoint: cp.store.clone(),
                    this: store.clone(),
                }),
                None => None,
            };
            faults.push(fault);
        }
        let watch: BTreeSet<i64> = checkpoints
            .iter()
            .zip(&faults)
            .filter(|(_, f)| f.is_none())
            .map(|(cp, _)| cp.seq)
            .collect();
        let mut c = self.inner.pool.conn().await?;
        let walk = audit::walk(&mut c, &ChainPoint::genesis(), &watch).await?;
        let checks = checkpoints
            .iter()
            .zip(faults)
            .map(|(cp, fault)| {
                let fault = fault.or_else(|| against_walk(cp, &walk));
                CheckpointCheck {
                    checkpoint: cp.clone(),
                    fault,
                }
            })
            .collect();
        Ok(CheckpointReport {
            chain: walk.report,
            checks,
        })
    }
}

/// A checkpoint whose signature and store hold, against the walked chain.
fn against_walk(cp: &SignedCheckpoint, walk: &audit::Walk) -> Option<CheckpointFault> {
    if let Some(stored) = walk.watched.get(&cp.seq) {
        return (*stored != cp.hash).then(|| CheckpointFault::Rewritten {
            seq: cp.seq,
            stored: stored.clone(),
            signed: cp.hash.clone(),
        });
    }
    match &walk.report.broken {
        Some(link) => Some(CheckpointFault::Unreached {
            seq: cp.seq,
            broken_at: link.seq,
        }),
        None => Some(CheckpointFault::Truncated {
            seq: cp.seq,
            last_seq: walk.last.seq,
        }),
    }
}
