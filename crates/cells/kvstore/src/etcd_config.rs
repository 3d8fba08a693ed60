//! Which etcd `kvstore: etcd` talks to, and how: the endpoints of `kvstore-endpoints`, or
//! Cilium's etcd configuration file (`kvstore-opt: etcd.config=FILE`) with TLS. Everything is
//! read and checked once, at start, exactly as the client will use it, so that a
//! configuration that cannot work stops the agent (or the operator) there, naming the file
//! and the key, before anything is written.
//!
//! The file is YAML with Cilium's names (those of etcd's client):
//!
//! ```yaml
//! endpoints:
//! - https://10.0.0.1:2379
//! trusted-ca-file: /var/lib/etcd-secrets/etcd-client-ca.crt   # or ca-file, its older name
//! cert-file: /var/lib/etcd-secrets/etcd-client.crt
//! key-file: /var/lib/etcd-secrets/etcd-client.key
//! username: cilium          # with password: etcd's own authentication, https only
//! password: ...
//! ```

use std::path::{Path, PathBuf};

use etcd_client::{Certificate, Identity, TlsOptions};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use crate::config::KvstoreConfig;

/// The `kvstore-opt` option naming the etcd configuration file.
pub const ETCD_CONFIG: &str = "etcd.config";

/// The endpoints and their TLS, checked.
#[derive(Debug, Clone, Default)]
pub struct EtcdAccess {
    /// The members' client URLs.
    pub endpoints: Vec<String>,
    /// With `https://` endpoints: the CA the members' certificates must chain to, and this
    /// client's certificate and key when the file gives them.
    pub tls: Option<TlsOptions>,
    /// etcd's user name and password, when the file gives them (only with `tls`).
    pub credentials: Option<Credentials>,
}

/// An etcd user name and its password. Its `Debug` leaves the password out, so that no log
/// or status line carries it.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// The file, as Cilium's (and etcd's client) spell its keys. Any other key is refused: a
/// misspelt `trusted-ca-file` must not quietly mean "no TLS".
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct EtcdConfigFile {
    #[serde(default)]
    endpoints: Vec<String>,
    trusted_ca_file: Option<PathBuf>,
    /// etcd's older name of `trusted-ca-file`, still in Cilium's examples.
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    username: Option<String>,
    password: Option<String>,
}

impl EtcdAccess {
    /// The access `cfg` configures (with `kvstore: etcd`); the error names the key, and the
    /// file with the key in it.
    pub fn from_config(cfg: &KvstoreConfig) -> Result<EtcdAccess, String> {
        if let Some(name) = cfg.kvstore_opt.0.keys().find(|n| *n != ETCD_CONFIG) {
            return Err(format!(
                "kvstore-opt {name}: not supported (only {ETCD_CONFIG})"
            ));
        }
        let Some(path) = cfg.kvstore_opt.get(ETCD_CONFIG) else {
            let endpoints = cfg.endpoints();
            if endpoints.is_empty() {
                return Err(
                    "kvstore: etcd needs kvstore-endpoints (comma-separated URLs) \
                     or kvstore-opt etcd.config=FILE"
                        .into(),
                );
            }
            if let Some(e) = endpoints.iter().find(|e| e.starts_with("https://")) {
                return Err(format!(
                    "kvstore-endpoints: {e} is https, which needs a CA to verify etcd with: \
                     give the endpoints and trusted-ca-file in kvstore-opt etcd.config=FILE"
                ));
            }
            check_urls(&endpoints).map_err(|e| format!("kvstore-endpoints: {e}"))?;
            return Ok(EtcdAccess {
                endpoints,
                tls: None,
                credentials: None,
            });
        };
        if !cfg.endpoints().is_empty() {
            return Err(format!(
                "kvstore-endpoints and kvstore-opt {ETCD_CONFIG} ({path}) both give etcd's \
                 endpoints: give them in the file only"
            ));
        }
        read_file(Path::new(path)).map_err(|e| format!("kvstore-opt {ETCD_CONFIG} {path}: {e}"))
    }
}

impl EtcdAccess {
    /// A client of these endpoints with their TLS and credentials (connections are made as
    /// requests need them; with credentials, the first token is asked for now).
    pub async fn connect(&self) -> Result<etcd_client::Client, String> {
        etcd_client::Client::connect(&self.endpoints, Some(self.options()))
            .await
            .map_err(|e| crate::store::describe(&e))
    }

    /// Connect options with this access's TLS and credentials. An expired token is renewed
    /// with the credentials and the request retried (etcd's simple tokens live 5 minutes by
    /// default).
    pub fn options(&self) -> etcd_client::ConnectOptions {
        let mut options = etcd_client::ConnectOptions::new();
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.clone());
        }
        if let Some(c) = &self.credentials {
            options = options
                .with_user(c.user.clone(), c.password.clone())
                .with_auto_token_refresh(true);
        }
        options
    }
}

fn check_urls(endpoints: &[String]) -> Result<(), String> {
    for e in endpoints {
        let rest = e
            .strip_prefix("http://")
            .or_else(|| e.strip_prefix("https://"))
            .ok_or_else(|| format!("{e} is not an http:// or https:// URL"))?;
        if rest.is_empty() {
            return Err(format!("{e} names no host"));
        }
    }
    Ok(())
}

fn read_file(path: &Path) -> Result<EtcdAccess, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut file: EtcdConfigFile = serde_yaml::from_str(&text).map_err(|e| e.to_string())?;
    if file.endpoints.is_empty() {
        return Err("endpoints: none given".into());
    }
    check_urls(&file.endpoints).map_err(|e| format!("endpoints: {e}"))?;
    let credentials = credentials(file.username.take(), file.password.take())?;
    let ca = match (&file.trusted_ca_file, &file.ca_file) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "trusted-ca-file {} and ca-file {} name different CAs: give one",
                a.display(),
                b.display()
            ));
        }
        (Some(a), _) => Some(("trusted-ca-file", a)),
        (None, Some(b)) => Some(("ca-file", b)),
        (None, None) => None,
    };
    let https = file.endpoints.iter().filter(|e| e.starts_with("https://"));
    let Some(first_https) = https.clone().next() else {
        // The client refuses TLS options with http endpoints; so does the start, rather
        // than dropping files the operator meant to be used.
        // A password over http:// would cross the network in clear, to anyone on the path.
        let given = [
            ca.map(|(key, _)| key),
            file.cert_file.as_ref().map(|_| "cert-file"),
            file.key_file.as_ref().map(|_| "key-file"),
            credentials.as_ref().map(|_| "username"),
        ];
        if let Some(key) = given.into_iter().flatten().next() {
            return Err(format!(
                "{key} is given but the endpoints are http://: use https:// endpoints"
            ));
        }
        return Ok(EtcdAccess {
            endpoints: file.endpoints,
            tls: None,
            credentials: None,
        });
    };
    if https.count() != file.endpoints.len() {
        return Err("endpoints: mixes http:// and https://: TLS is for all of them or none".into());
    }
    let Some((ca_key, ca_path)) = ca else {
        return Err(format!(
            "trusted-ca-file: missing, and {first_https} is https: etcd's certificate cannot be \
             verified without it"
        ));
    };
    let pair = match (&file.cert_file, &file.key_file) {
        (None, None) => None,
        (Some(_), None) => return Err("cert-file is given without key-file".into()),
        (None, Some(_)) => return Err("key-file is given without cert-file".into()),
        (Some(cert), Some(key)) => Some((cert, key)),
    };
    let ca_pem = read_certificates(ca_key, ca_path)?;
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert_path, key_path)) = pair {
        let cert = read_certificates("cert-file", cert_path)?;
        let key =
            std::fs::read(key_path).map_err(|e| format!("key-file {}: {e}", key_path.display()))?;
        PrivateKeyDer::from_pem_slice(&key)
            .map_err(|e| format!("key-file {}: no PEM private key: {e}", key_path.display()))?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    // What the client will do with them, done now: a key that is not the certificate's is
    // refused here (rustls compares their public keys), not at the first connection.
    for e in &file.endpoints {
        let endpoint = tonic::transport::Endpoint::from_shared(e.clone())
            .map_err(|err| format!("endpoints: {e}: {}", chain(&err)))?;
        if let Err(err) = endpoint.tls_config(tls.clone()) {
            return Err(match pair {
                Some((cert, key)) => format!(
                    "key-file {} does not go with cert-file {}: {}",
                    key.display(),
                    cert.display(),
                    chain(&err)
                ),
                None => format!("{ca_key} {}: {}", ca_path.display(), chain(&err)),
            });
        }
    }
    Ok(EtcdAccess {
        endpoints: file.endpoints,
        tls: Some(tls),
        credentials,
    })
}

/// `username` and `password`: both or neither, neither empty.
fn credentials(
    username: Option<String>,
    password: Option<String>,
) -> Result<Option<Credentials>, String> {
    match (username, password) {
        (None, None) => Ok(None),
        (Some(_), None) => Err("username is given without password".into()),
        (None, Some(_)) => Err("password is given without username".into()),
        (Some(user), Some(_)) if user.is_empty() => Err("username: empty".into()),
        (Some(_), Some(password)) if password.is_empty() => Err("password: empty".into()),
        (Some(user), Some(password)) => Ok(Some(Credentials { user, password })),
    }
}

/// The PEM text of file `key` names, which must hold certificates and nothing unreadable.
fn read_certificates(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{key} {}: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{key} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{key} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(pem)
}

/// An error with its causes, each once: TLS failures are told in the innermost one.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KvstoreKind, KvstoreOpt};

    fn with_file(dir: &Path, yaml: &str) -> KvstoreConfig {
        let path = dir.join("etcd.config");
        std::fs::write(&path, yaml).unwrap();
        KvstoreConfig {
            kvstore: KvstoreKind::Etcd,
            kvstore_opt: KvstoreOpt([(ETCD_CONFIG.to_string(), path.display().to_string())].into()),
            ..KvstoreConfig::default()
        }
    }

    fn refused(cfg: &KvstoreConfig) -> String {
        EtcdAccess::from_config(cfg).expect_err("refused")
    }

    #[test]
    fn plain_endpoints_come_from_either_place_and_https_needs_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = KvstoreConfig {
            kvstore: KvstoreKind::Etcd,
            kvstore_endpoints: "http://10.0.0.1:2379, http://10.0.0.2:2379".into(),
            ..KvstoreConfig::default()
        };
        let access = EtcdAccess::from_config(&cfg).unwrap();
        assert_eq!(access.endpoints.len(), 2);
        assert!(access.tls.is_none());
        let https = KvstoreConfig {
            kvstore_endpoints: "https://10.0.0.1:2379".into(),
            ..cfg.clone()
        };
        assert!(refused(&https).contains("kvstore-endpoints: https://10.0.0.1:2379 is https"));

        let file = with_file(dir.path(), "endpoints: [http://10.0.0.1:2379]\n");
        assert_eq!(
            EtcdAccess::from_config(&file).unwrap().endpoints,
            ["http://10.0.0.1:2379"]
        );
        let both = KvstoreConfig {
            kvstore_endpoints: "http://10.0.0.3:2379".into(),
            ..file
        };
        assert!(refused(&both).contains("both give etcd's endpoints"));
        let other = KvstoreConfig {
            kvstore_opt: KvstoreOpt([("etcd.address".into(), "x".into())].into()),
            ..cfg
        };
        assert!(refused(&other).contains("kvstore-opt etcd.address: not supported"));
    }

    #[test]
    fn a_file_that_cannot_work_is_refused_naming_the_file_and_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let missing = KvstoreConfig {
            kvstore: KvstoreKind::Etcd,
            kvstore_opt: KvstoreOpt([(ETCD_CONFIG.into(), format!("{d}/absent"))].into()),
            ..KvstoreConfig::default()
        };
        let e = refused(&missing);
        assert!(
            e.starts_with(&format!("kvstore-opt etcd.config {d}/absent: ")),
            "{e}"
        );
        let file = format!("kvstore-opt etcd.config {d}/etcd.config: ");
        let cases = [
            ("endpoints: []\n", "endpoints: none given"),
            (
                "endpoints: [https://127.0.0.1:2379]\n",
                "trusted-ca-file: missing, and https://127.0.0.1:2379 is https",
            ),
            (
                "endpoints: [http://127.0.0.1:2379]\ncert-file: /x\nkey-file: /y\n",
                "cert-file is given but the endpoints are http://",
            ),
            (
                "endpoints: [https://127.0.0.1:2379, http://127.0.0.2:2379]\nca-file: /x\n",
                "endpoints: mixes http:// and https://",
            ),
            (
                "endpoints: [https://127.0.0.1:2379]\ntrusted-ca-fle: /x\n",
                "unknown field `trusted-ca-fle`",
            ),
            (
                "endpoints: [https://127.0.0.1:2379]\ntrusted-ca-file: /nonexistent/ca.pem\n",
                "trusted-ca-file /nonexistent/ca.pem: No such file",
            ),
            (
                "endpoints: [127.0.0.1:2379]\n",
                "endpoints: 127.0.0.1:2379 is not an http:// or https:// URL",
            ),
            (
                "endpoints: [http://127.0.0.1:2379]\nusername: u\npassword: p\n",
                "username is given but the endpoints are http://",
            ),
            (
                "endpoints: [https://127.0.0.1:2379]\nusername: u\n",
                "username is given without password",
            ),
            (
                "endpoints: [https://127.0.0.1:2379]\npassword: p\n",
                "password is given without username",
            ),
            (
                "endpoints: [https://127.0.0.1:2379]\nusername: ''\npassword: p\n",
                "username: empty",
            ),
        ];
        for (yaml, why) in cases {
            let e = refused(&with_file(dir.path(), yaml));
            assert!(e.starts_with(&file) && e.contains(why), "{yaml}: {e}");
        }
        // A CA file without a certificate in it.
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let yaml = format!(
            "endpoints: [https://127.0.0.1:2379]\nca-file: {}\n",
            junk.display()
        );
        let e = refused(&with_file(dir.path(), &yaml));
        assert!(
            e.contains("ca-file") && e.contains("no PEM certificate"),
            "{e}"
        );
        let yaml = format!(
            "endpoints: [https://127.0.0.1:2379]\ntrusted-ca-file: {0}\ncert-file: {0}\n",
            junk.display()
        );
        let e = refused(&with_file(dir.path(), &yaml));
        assert!(e.contains("cert-file is given without key-file"), "{e}");
    }

    /// A CA, and a client certificate it signed, in `dir`: `ca.pem`, `client.pem`,
    /// `client.key`; and `other.key`, a key of no certificate.
    fn certificates(dir: &Path) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let client = rcgen::CertificateParams::new(vec!["agent".to_string()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.join("client.pem"), client.pem()).unwrap();
        std::fs::write(dir.join("client.key"), key.serialize_pem()).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(dir.join("other.key"), other.serialize_pem()).unwrap();
    }

    #[test]
    fn certificates_are_checked_as_the_client_will_use_them() {
        let dir = tempfile::tempdir().unwrap();
        certificates(dir.path());
        let d = dir.path().display();
        let good = format!(
            "endpoints: [https://127.0.0.1:2379]\ntrusted-ca-file: {d}/ca.pem\n\
             cert-file: {d}/client.pem\nkey-file: {d}/client.key\n"
        );
        let access = EtcdAccess::from_config(&with_file(dir.path(), &good)).unwrap();
        assert_eq!(access.endpoints, ["https://127.0.0.1:2379"]);
        assert!(access.tls.is_some());
        assert_eq!(access.credentials, None);
        // With a user name and password, which no debug output shows.
        let with_user = format!("{good}username: cilium\npassword: s3cr3t-pw\n");
        let access = EtcdAccess::from_config(&with_file(dir.path(), &with_user)).unwrap();
        let credentials = access.credentials.clone().expect("credentials");
        assert_eq!(
            (credentials.user.as_str(), credentials.password.as_str()),
            ("cilium", "s3cr3t-pw")
        );
        let shown = format!("{access:?}");
        assert!(
            shown.contains("cilium") && !shown.contains("s3cr3t-pw"),
            "{shown}"
        );
        let ca_only = format!("endpoints: [https://127.0.0.1:2379]\nca-file: {d}/ca.pem\n");
        assert!(
            EtcdAccess::from_config(&with_file(dir.path(), &ca_only))
                .unwrap()
                .tls
                .is_some()
        );
        // The key of another certificate, or a file with no key in it.
        let mismatch = good.replace("client.key", "other.key");
        let e = refused(&with_file(dir.path(), &mismatch));
        assert!(
            e.contains(&format!(
                "key-file {d}/other.key does not go with cert-file {d}/client.pem"
            )),
            "{e}"
        );
        let no_key = good.replace("client.key", "client.pem");
        let e = refused(&with_file(dir.path(), &no_key));
        assert!(
            e.contains(&format!("key-file {d}/client.pem: no PEM private key")),
            "{e}"
        );
        let unreadable = good.replace("client.pem", "absent.pem");
        let e = refused(&with_file(dir.path(), &unreadable));
        assert!(
            e.contains(&format!("cert-file {d}/absent.pem: No such file")),
            "{e}"
        );
    }
}
