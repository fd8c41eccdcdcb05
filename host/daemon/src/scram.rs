//! SCRAM (RFC 5802, with the SHA-256 and SHA-512 hashes of RFC 7677 and Kafka): the salted
//! credentials a user is stored as, and the server's side of one authentication.
//!
//! A credential never holds the password, only what the server needs to check a proof
//! (`StoredKey = H(HMAC(SaltedPassword, "Client Key"))`) and to prove itself back
//! (`ServerKey = HMAC(SaltedPassword, "Server Key")`). The same credential checks a PLAIN
//! password ([`ScramCredential::verify_password`]): the password is salted and hashed again and
//! compared with the stored key, so PLAIN needs no second form of the secret.
//!
//! The hashes are ring's, which rustls already links (no second crypto library in the binary).
//! Comparisons of secrets run without an early exit.

use std::num::NonZeroU32;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use ring::rand::SecureRandom as _;
use ring::{digest, hmac, pbkdf2};
use serde::{Deserialize, Serialize};

/// Iterations a new credential is salted with, as Kafka's tools default to.
pub const DEFAULT_ITERATIONS: u32 = 4_096;
/// Fewest iterations a credential may have (Kafka's floor).
pub const MIN_ITERATIONS: u32 = 4_096;
/// Most iterations a credential may have (Kafka's ceiling): each PLAIN check and each new
/// credential costs this many HMACs.
pub const MAX_ITERATIONS: u32 = 16_384;
/// Bytes of salt in a new credential.
const SALT_BYTES: usize = 16;
/// Bytes of randomness in the server's nonce.
const NONCE_BYTES: usize = 24;
/// Longest SCRAM message taken from a client: the messages are a user name, a nonce and a
/// proof, a few hundred bytes.
pub const MAX_MESSAGE_BYTES: usize = 4_096;

/// A SCRAM hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Mechanism {
    /// SCRAM-SHA-256.
    #[serde(rename = "SCRAM-SHA-256")]
    Sha256,
    /// SCRAM-SHA-512.
    #[serde(rename = "SCRAM-SHA-512")]
    Sha512,
}

impl Mechanism {
    /// Both, in the order they are offered.
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    /// The SASL name: `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism of a SASL name (case as SASL writes it), if it is one.
    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Mechanism::Sha256 => hmac::HMAC_SHA256,
            Mechanism::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Mechanism::Sha256 => &digest::SHA256,
            Mechanism::Sha512 => &digest::SHA512,
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Mechanism::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Mechanism::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    /// Bytes of the hash's output.
    fn len(self) -> usize {
        self.digest().output_len()
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One user's salted credential for one mechanism: what the metastore records. Its `Debug`
/// shows the mechanism and iterations only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScramCredential {
    /// The hash.
    pub mechanism: Mechanism,
    /// The salt, base64 in JSON.
    #[serde(with = "b64")]
    pub salt: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// `H(ClientKey)`, base64 in JSON.
    #[serde(with = "b64")]
    pub stored_key: Vec<u8>,
    /// `ServerKey`, base64 in JSON.
    #[serde(with = "b64")]
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

/// Why a credential or a SCRAM message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScramError {
    /// Iterations outside [`MIN_ITERATIONS`]..=[`MAX_ITERATIONS`].
    #[error("{iterations} iterations is outside {MIN_ITERATIONS}..={MAX_ITERATIONS}")]
    Iterations {
        /// What was asked.
        iterations: u32,
    },
    /// A stored or sent credential whose keys or salt have the wrong length.
    #[error("a {mechanism} credential needs {expected}-byte keys and a salt of 8 to 64 bytes")]
    Shape {
        /// The mechanism.
        mechanism: Mechanism,
        /// The key length it needs.
        expected: usize,
    },
    /// An empty password.
    #[error("the password is empty")]
    EmptyPassword,
    /// A client message that is not SCRAM as RFC 5802 writes it.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// The client asked for channel binding, which this server does not offer.
    #[error("channel binding is not supported")]
    ChannelBinding,
    /// Wrong password, unknown user, or a nonce that is not this exchange's.
    #[error("invalid credentials")]
    InvalidCredentials,
}

impl ScramCredential {
    /// A credential for `password` with a fresh random salt.
    pub fn new(
        mechanism: Mechanism,
        password: &[u8],
        iterations: u32,
    ) -> Result<ScramCredential, ScramError> {
        let mut salt = vec![0u8; SALT_BYTES];
        fill_random(&mut salt);
        ScramCredential::with_salt(mechanism, password, salt, iterations)
    }

    /// The credential for `password` with `salt` (tests use known salts).
    pub fn with_salt(
        mechanism: Mechanism,
        password: &[u8],
        salt: Vec<u8>,
        iterations: u32,
    ) -> Result<ScramCredential, ScramError> {
        check_iterations(iterations)?;
        if password.is_empty() {
            return Err(ScramError::EmptyPassword);
        }
        let salted = salted_password(mechanism, password, &salt, iterations);
        let client_key = hmac_of(mechanism, &salted, b"Client Key");
        Ok(ScramCredential {
            mechanism,
            stored_key: digest::digest(mechanism.digest(), &client_key)
                .as_ref()
                .to_vec(),
            server_key: hmac_of(mechanism, &salted, b"Server Key"),
            salt,
            iterations,
        })
    }

    /// Checks a credential that came from outside (an API request, the metastore): the
    /// iterations in range and every field of the right length.
    pub fn validate(&self) -> Result<(), ScramError> {
        check_iterations(self.iterations)?;
        let expected = self.mechanism.len();
        if self.stored_key.len() != expected
            || self.server_key.len() != expected
            || !(8..=64).contains(&self.salt.len())
        {
            return Err(ScramError::Shape {
                mechanism: self.mechanism,
                expected,
            });
        }
        Ok(())
    }

    /// Whether `password` is the one this credential was made from: salted and hashed again
    /// ([`ScramCredential::iterations`] HMACs, about a millisecond), compared without an early
    /// exit.
    pub fn verify_password(&self, password: &[u8]) -> bool {
        let salted = salted_password(self.mechanism, password, &self.salt, self.iterations);
        let client_key = hmac_of(self.mechanism, &salted, b"Client Key");
        let stored = digest::digest(self.mechanism.digest(), &client_key);
        same_bytes(stored.as_ref(), &self.stored_key)
    }
}

fn check_iterations(iterations: u32) -> Result<(), ScramError> {
    if (MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        Ok(())
    } else {
        Err(ScramError::Iterations { iterations })
    }
}

fn salted_password(mechanism: Mechanism, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut out = vec![0u8; mechanism.len()];
    // Checked in range by every caller's credential; 1 is never reached.
    let rounds = NonZeroU32::new(iterations).unwrap_or(NonZeroU32::MIN);
    pbkdf2::derive(mechanism.pbkdf2(), rounds, salt, password, &mut out);
    out
}

fn hmac_of(mechanism: Mechanism, key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = hmac::Key::new(mechanism.hmac(), key);
    hmac::sign(&key, data).as_ref().to_vec()
}

/// Equal length and equal bytes, looking at every byte.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Fills `buf` from the system's random source. The source failing is a broken machine, not a
/// client's doing: then the bytes come from a hash of the time and the address of `buf`, never
/// zeros.
pub fn fill_random(buf: &mut [u8]) {
    if ring::rand::SystemRandom::new().fill(buf).is_ok() {
        return;
    }
    tracing::error!("the system random source failed; SCRAM salts and nonces fall back to a hash");
    let seed = format!("{:?}{:p}", std::time::SystemTime::now(), buf.as_ptr());
    let hash = digest::digest(&digest::SHA512, seed.as_bytes());
    for (out, byte) in buf.iter_mut().zip(hash.as_ref().iter().cycle()) {
        *out = *byte;
    }
}

/// A client's first message, read: who it says it is and its nonce.
#[derive(Debug, Clone)]
pub struct ClientFirst {
    /// The user the client names.
    pub user: String,
    client_nonce: String,
    bare: String,
}

impl ClientFirst {
    /// Reads a client's first message (`n,,n=user,r=nonce`).
    pub fn parse(client_first: &[u8]) -> Result<ClientFirst, ScramError> {
        let message = text(client_first)?;
        // gs2-header: "n,," or "y,," (no channel binding), an optional authzid between.
        let (binding, rest) = message
            .split_once(',')
            .ok_or(ScramError::Malformed("no GS2 header"))?;
        match binding {
            "n" | "y" => {}
            b if b.starts_with("p=") => return Err(ScramError::ChannelBinding),
            _ => return Err(ScramError::Malformed("GS2 header is not n, y or p=")),
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or(ScramError::Malformed("no client-first-message-bare"))?;
        let mut user = None;
        let mut client_nonce = None;
        for (i, attribute) in bare.split(',').enumerate() {
            match (i, attribute.split_once('=')) {
                (0, Some(("m", _))) => {
                    return Err(ScramError::Malformed("mandatory extension"));
                }
                (0, Some(("n", name))) => user = Some(sasl_name(name)?),
                (1, Some(("r", nonce))) => client_nonce = Some(nonce),
                // Extensions after the nonce (Kafka's tokenauth) carry nothing we use.
                (i, Some(_)) if i >= 2 => {}
                _ => return Err(ScramError::Malformed("expected n=user,r=nonce")),
            }
        }
        let (Some(user), Some(client_nonce)) = (user, client_nonce) else {
            return Err(ScramError::Malformed("expected n=user,r=nonce"));
        };
        if client_nonce.is_empty() || !client_nonce.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(ScramError::Malformed("the nonce is not printable"));
        }
        if let Some(authz) = authzid.strip_prefix("a=")
            && sasl_name(authz)? != user
        {
            return Err(ScramError::InvalidCredentials);
        }
        Ok(ClientFirst {
            user,
            client_nonce: client_nonce.to_owned(),
            bare: bare.to_owned(),
        })
    }
}

/// The server's side of one SCRAM exchange, between the client's first message and its
/// final one.
#[derive(Debug)]
pub struct ServerExchange {
    mechanism: Mechanism,
    user: String,
    /// `None` for an unknown user: the exchange goes on with a made-up salt so that the answer
    /// does not tell which user names exist, and fails at the proof.
    credential: Option<ScramCredential>,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// What an exchange ends with.
#[derive(Debug)]
pub struct Authenticated {
    /// The user the client proved to be.
    pub user: String,
    /// The server's final message (`v=` its signature), for the client to check.
    pub server_final: Vec<u8>,
}

impl ServerExchange {
    /// Answers the client's first message with the server's first (the nonce, the salt, the
    /// iterations). `credential` is the named user's for `mechanism`, `None` when there is
    /// none; `secret` then makes up a salt, the same for the same name each time.
    pub fn start(
        mechanism: Mechanism,
        first: ClientFirst,
        credential: Option<ScramCredential>,
        secret: &[u8],
    ) -> (ServerExchange, Vec<u8>) {
        let mut nonce = vec![0u8; NONCE_BYTES];
        fill_random(&mut nonce);
        ServerExchange::start_with_nonce(mechanism, first, credential, secret, &B64.encode(&nonce))
    }

    fn start_with_nonce(
        mechanism: Mechanism,
        first: ClientFirst,
        credential: Option<ScramCredential>,
        secret: &[u8],
        server_nonce: &str,
    ) -> (ServerExchange, Vec<u8>) {
        let credential = credential.filter(|c| c.mechanism == mechanism);
        let (salt, iterations) = match &credential {
            Some(c) => (c.salt.clone(), c.iterations),
            None => {
                let made_up = hmac_of(Mechanism::Sha256, secret, first.user.as_bytes());
                (made_up[..SALT_BYTES].to_vec(), DEFAULT_ITERATIONS)
            }
        };
        let nonce = format!("{}{server_nonce}", first.client_nonce);
        let server_first = format!("r={nonce},s={},i={iterations}", B64.encode(&salt));
        let exchange = ServerExchange {
            mechanism,
            user: first.user,
            credential,
            client_first_bare: first.bare,
            server_first: server_first.clone(),
            nonce,
        };
        (exchange, server_first.into_bytes())
    }

    /// The exchange's mechanism.
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// The user this exchange is for, as the client named them.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Checks the client's final message (the channel binding echo, the nonce, the proof).
    pub fn finish(self, client_final: &[u8]) -> Result<Authenticated, ScramError> {
        let message = text(client_final)?;
        let (without_proof, proof) = message
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof"))?;
        let mut parts = without_proof.split(',');
        let binding = parts
            .next()
            .and_then(|p| p.strip_prefix("c="))
            .ok_or(ScramError::Malformed("no channel binding"))?;
        let nonce = parts
            .next()
            .and_then(|p| p.strip_prefix("r="))
            .ok_or(ScramError::Malformed("no nonce"))?;
        // Only "n,," and "y,," (with an authzid or not) are taken at the start; the echo is
        // their base64, and it carries no binding data.
        let echoed = B64
            .decode(binding)
            .map_err(|_| ScramError::Malformed("channel binding is not base64"))?;
        if !(echoed.starts_with(b"n,") || echoed.starts_with(b"y,")) {
            return Err(ScramError::ChannelBinding);
        }
        // The echo must end with this exchange's nonce. librdkafka sends the client nonce in
        // front of the whole nonce (so it appears twice), and Kafka brokers take any echo that
        // ends with theirs; the proof covers the echo as sent either way.
        if !nonce.ends_with(&self.nonce) {
            return Err(ScramError::InvalidCredentials);
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("the proof is not base64"))?;
        let Some(credential) = self.credential else {
            return Err(ScramError::InvalidCredentials);
        };
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let signature = hmac_of(
            self.mechanism,
            &credential.stored_key,
            auth_message.as_bytes(),
        );
        if proof.len() != signature.len() {
            return Err(ScramError::InvalidCredentials);
        }
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let stored = digest::digest(self.mechanism.digest(), &client_key);
        if !same_bytes(stored.as_ref(), &credential.stored_key) {
            return Err(ScramError::InvalidCredentials);
        }
        let server_signature = hmac_of(
            self.mechanism,
            &credential.server_key,
            auth_message.as_bytes(),
        );
        Ok(Authenticated {
            user: self.user,
            server_final: format!("v={}", B64.encode(server_signature)).into_bytes(),
        })
    }
}

fn text(message: &[u8]) -> Result<&str, ScramError> {
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(ScramError::Malformed("message too long"));
    }
    std::str::from_utf8(message).map_err(|_| ScramError::Malformed("message is not UTF-8"))
}

/// A `saslname`: `=2C` is a comma and `=3D` an equals sign; any other `=` is malformed.
fn sasl_name(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3);
        match code {
            Some("2C") => out.push(','),
            Some("3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in the user name")),
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(ScramError::Malformed("empty user name"));
    }
    Ok(out)
}

/// Base64 (standard alphabet, padded) for the credential's byte fields.
mod b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example: user "user", password "pencil".
    fn rfc7677() -> ScramCredential {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        ScramCredential::with_salt(Mechanism::Sha256, b"pencil", salt, 4096).unwrap()
    }

    /// Starts an exchange as a server that knows only `user` (RFC 7677's).
    fn start(first: &[u8], server_nonce: &str) -> Result<(ServerExchange, Vec<u8>), ScramError> {
        let first = ClientFirst::parse(first)?;
        let credential = (first.user == "user").then(rfc7677);
        Ok(ServerExchange::start_with_nonce(
            Mechanism::Sha256,
            first,
            credential,
            b"secret",
            server_nonce,
        ))
    }

    #[test]
    fn the_rfc_7677_exchange_authenticates_and_the_server_signature_matches() {
        let (exchange, server_first) = start(
            b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        )
        .unwrap();
        assert_eq!(
            server_first,
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let done = exchange
            .finish(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            )
            .unwrap();
        assert_eq!(done.user, "user");
        assert_eq!(
            done.server_final,
            b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    #[test]
    fn a_wrong_proof_a_foreign_nonce_and_an_unknown_user_are_refused() {
        let exchange = start(b"n,,n=user,r=abc", "XYZ").unwrap().0;
        let bad_proof = format!("c=biws,r=abcXYZ,p={}", B64.encode([7u8; 32]));
        assert_eq!(
            exchange.finish(bad_proof.as_bytes()).unwrap_err(),
            ScramError::InvalidCredentials
        );
        let exchange = start(b"n,,n=user,r=abc", "XYZ").unwrap().0;
        let other_nonce = format!("c=biws,r=abcXYQ,p={}", B64.encode([7u8; 32]));
        assert_eq!(
            exchange.finish(other_nonce.as_bytes()).unwrap_err(),
            ScramError::InvalidCredentials
        );
        // An unknown user gets a salt like anyone's, the same one each time, then a refusal.
        let (a, first_a) = start(b"n,,n=nobody,r=abc", "XYZ").unwrap();
        let (_, first_b) = start(b"n,,n=nobody,r=abc", "XYZ").unwrap();
        assert_eq!(first_a, first_b);
        assert!(String::from_utf8(first_a).unwrap().contains(",i=4096"));
        let final_message = format!("c=biws,r=abcXYZ,p={}", B64.encode([7u8; 32]));
        assert_eq!(
            a.finish(final_message.as_bytes()).unwrap_err(),
            ScramError::InvalidCredentials
        );
    }

    #[test]
    fn malformed_first_messages_and_channel_binding_are_refused() {
        for (message, expected) in [
            (
                &b"p=tls-unique,,n=user,r=abc"[..],
                ScramError::ChannelBinding,
            ),
            (
                b"n,,r=abc,n=user",
                ScramError::Malformed("expected n=user,r=nonce"),
            ),
            (
                b"n,,m=ext,n=user,r=abc",
                ScramError::Malformed("mandatory extension"),
            ),
            (
                b"n,,n=us=zzer,r=abc",
                ScramError::Malformed("bad escape in the user name"),
            ),
            (b"garbage", ScramError::Malformed("no GS2 header")),
            (
                b"n,,n=user,r=",
                ScramError::Malformed("the nonce is not printable"),
            ),
            (b"n,a=other,n=user,r=abc", ScramError::InvalidCredentials),
        ] {
            let got = ClientFirst::parse(message).unwrap_err();
            assert_eq!(got, expected, "{}", String::from_utf8_lossy(message));
        }
        let long = vec![b'a'; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(
            ClientFirst::parse(&long),
            Err(ScramError::Malformed("message too long"))
        ));
    }

    /// The client's side of the final message for `password`: `without_proof` and its proof.
    fn client_final(
        password: &[u8],
        credential: &ScramCredential,
        client_first_bare: &str,
        server_first: &str,
        without_proof: &str,
    ) -> String {
        let m = credential.mechanism;
        let salted = salted_password(m, password, &credential.salt, credential.iterations);
        let client_key = hmac_of(m, &salted, b"Client Key");
        let stored = digest::digest(m.digest(), &client_key);
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let signature = hmac_of(m, stored.as_ref(), auth.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(k, s)| k ^ s)
            .collect();
        format!("{without_proof},p={}", B64.encode(proof))
    }

    #[test]
    fn librdkafkas_echo_with_the_client_nonce_twice_authenticates_and_a_foreign_one_does_not() {
        let credential = ScramCredential::new(Mechanism::Sha512, b"builder", 4096).unwrap();
        let first = ClientFirst::parse(b"n,,n=bob,r=cnonce").unwrap();
        let (exchange, server_first) = ServerExchange::start_with_nonce(
            Mechanism::Sha512,
            first.clone(),
            Some(credential.clone()),
            b"s",
            "SNONCE",
        );
        let server_first = String::from_utf8(server_first).unwrap();
        // librdkafka's form: "r=" + client nonce + the whole nonce of the server's message.
        let echo = client_final(
            b"builder",
            &credential,
            "n=bob,r=cnonce",
            &server_first,
            "c=biws,r=cnoncecnonceSNONCE",
        );
        assert_eq!(exchange.finish(echo.as_bytes()).unwrap().user, "bob");
        let (exchange, _) = ServerExchange::start_with_nonce(
            Mechanism::Sha512,
            first,
            Some(credential.clone()),
            b"s",
            "SNONCE",
        );
        let foreign = client_final(
            b"builder",
            &credential,
            "n=bob,r=cnonce",
            &server_first,
            "c=biws,r=cnonceOTHER",
        );
        assert_eq!(
            exchange.finish(foreign.as_bytes()).unwrap_err(),
            ScramError::InvalidCredentials
        );
    }

    #[test]
    fn escaped_names_are_read_as_the_user_wrote_them() {
        assert_eq!(sasl_name("a=2Cb=3Dc").unwrap(), "a,b=c");
        assert!(sasl_name("a=").is_err());
    }

    #[test]
    fn a_credential_checks_its_own_password_only_and_survives_json() {
        for mechanism in Mechanism::ALL {
            let credential = ScramCredential::new(mechanism, b"hunter2", 4096).unwrap();
            credential.validate().unwrap();
            assert!(credential.verify_password(b"hunter2"));
            assert!(!credential.verify_password(b"hunter3"));
            let json = serde_json::to_string(&credential).unwrap();
            assert!(!json.contains("hunter2"));
            let back: ScramCredential = serde_json::from_str(&json).unwrap();
            assert_eq!(back, credential);
            assert!(!format!("{credential:?}").contains("stored_key"));
        }
        assert_eq!(
            ScramCredential::new(Mechanism::Sha256, b"x", 100).unwrap_err(),
            ScramError::Iterations { iterations: 100 }
        );
        assert_eq!(
            ScramCredential::new(Mechanism::Sha256, b"", 4096).unwrap_err(),
            ScramError::EmptyPassword
        );
        let mut short = ScramCredential::new(Mechanism::Sha512, b"x", 4096).unwrap();
        short.stored_key.truncate(32);
        assert!(matches!(short.validate(), Err(ScramError::Shape { .. })));
    }
}
