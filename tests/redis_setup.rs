//! Setting the Redis backend up against real servers: a replica's URL is a clear error, at build
//! and at the first grant of a limiter built lazily; and (feature `redis-tls`) decisions over
//! TLS with a certificate authority the test makes, and a clear error for an untrusted one.

mod redis_support;

use redis_support::{DECISION_TIMEOUT, RedisServer};
use tollgate::redis::{RedisError, RedisRateLimiter, Source};
use tollgate::{Algorithm, Rule};

/// A primary and its replica, which has synchronised.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    (primary, replica)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_url_is_refused_at_build_and_named_at_the_first_grant_when_lazy() {
    let (primary, replica) = primary_and_replica();
    let url = format!("redis://:secret@127.0.0.1:{}", replica.port());
    let replica_url = replica.url();
    let error = RedisRateLimiter::builder(replica_url.clone(), Algorithm::TokenBucket)
        .plan("free", Rule::per_second(5).unwrap())
        .build()
        .await
        .unwrap_err();
    match &error {
        RedisError::ReadOnlyReplica { url } => assert_eq!(url, &replica_url),
        other => panic!("{other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("read-only replica") && message.contains("primary"),
        "{message}"
    );
    // The password stays hidden whatever the error (the replica has none to check it against).
    let error = RedisRateLimiter::builder(url, Algorithm::TokenBucket)
        .plan("free", Rule::per_second(5).unwrap())
        .build()
        .await
        .unwrap_err();
    assert!(!error.to_string().contains("secret"), "{error}");

    for algorithm in Algorithm::ALL {
        let lazy = RedisRateLimiter::builder(replica_url.clone(), algorithm)
            .plan("free", Rule::per_second(5).unwrap())
            .build_lazy()
            .unwrap();
        match lazy.decide("alice", &"free", 1).await {
            Err(RedisError::ReadOnlyReplica { url }) => assert_eq!(url, replica_url),
            other => panic!("{algorithm}: {other:?}"),
        }
    }

    // The primary is fine.
    let redis = RedisRateLimiter::builder(primary.url(), Algorithm::TokenBucket)
        .timeout(DECISION_TIMEOUT)
        .plan("free", Rule::per_second(5).unwrap())
        .build()
        .await
        .unwrap();
    assert_eq!(
        redis.decide("alice", &"free", 1).await.unwrap().source(),
        Source::Redis
    );
}

#[cfg(feature = "redis-tls")]
mod tls {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    use tollgate::redis::{RedisError, RedisRateLimiter, Source};
    use tollgate::{Algorithm, Rule};

    use super::redis_support::{DECISION_TIMEOUT, RedisCluster, RedisServer, ScratchDir};

    /// A certificate authority: its certificate in PEM, and the issuer to sign with.
    fn authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    }

    /// A `redis-server` speaking TLS only, with a certificate for 127.0.0.1 and localhost that
    /// `ca` signed.
    fn tls_server(ca: &CertifiedIssuer<'static, KeyPair>, dir: &ScratchDir) -> RedisServer {
        let (arguments, _) = tls_arguments(ca, dir);
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        RedisServer::start_tls(&arguments)
    }

    /// A server's `--tls-*` arguments for a certificate for 127.0.0.1 and localhost that `ca`
    /// signed (written into `dir`), clients not asked for certificates; and the file of `ca`'s
    /// certificate.
    fn tls_arguments(
        ca: &CertifiedIssuer<'static, KeyPair>,
        dir: &ScratchDir,
    ) -> (Vec<String>, String) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        let certificate = params.signed_by(&key, ca).unwrap();
        let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
        let (ca_file, cert_file, key_file) =
            (path("ca.pem"), path("server.pem"), path("server.key"));
        std::fs::write(&ca_file, ca.pem()).unwrap();
        std::fs::write(&cert_file, certificate.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let arguments = [
            "--tls-cert-file",
            &cert_file,
            "--tls-key-file",
            &key_file,
            "--tls-ca-cert-file",
            &ca_file,
            "--tls-auth-clients",
            "no",
        ];
        (arguments.map(str::to_owned).to_vec(), ca_file)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn decisions_over_tls_trust_the_given_authority_and_refuse_another() {
        let dir = ScratchDir::new("tls");
        let ca = authority("tollgate test CA");
        let server = tls_server(&ca, &dir);
        let url = format!("rediss://127.0.0.1:{}", server.port());

        for algorithm in Algorithm::ALL {
            let redis = RedisRateLimiter::builder(url.clone(), algorithm)
                .timeout(DECISION_TIMEOUT)
                .plan("free", Rule::per_hour(2).unwrap())
                .tls_root_certificate(ca.pem())
                .build()
                .await
                .unwrap();
            for expected in [true, true, false] {
                let answer = redis.decide("alice", &"free", 1).await.unwrap();
                assert_eq!(answer.source(), Source::Redis, "{algorithm}");
                assert_eq!(answer.decision().is_allowed(), expected, "{algorithm}");
            }
        }

        // Another authority's certificate, or the system's roots: not trusted, and said so.
        let other = authority("another CA");
        for root in [Some(other.pem()), None] {
            let mut builder = RedisRateLimiter::builder(url.clone(), Algorithm::TokenBucket)
                .plan("free", Rule::per_hour(2).unwrap());
            if let Some(root) = root {
                builder = builder.tls_root_certificate(root);
            }
            let error = builder.build().await.unwrap_err();
            assert!(
                matches!(error, RedisError::UntrustedCertificate { .. }),
                "{error:?}"
            );
            assert!(error.to_string().contains("is not trusted"), "{error}");
        }
    }
    /// A cluster whose nodes speak only TLS, reached by `rediss+cluster://` naming one node:
    /// clients spread over the three masters (so decisions follow `MOVED` over TLS) each get
    /// exactly their limit, under every method; without the authority, the build says the
    /// certificate is not trusted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cluster_over_tls_gives_every_client_its_limit_on_every_master() {
        let dir = ScratchDir::new("tls-cluster");
        let ca = authority("tollgate test CA");
        let (arguments, ca_file) = tls_arguments(&ca, &dir);
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        let cluster = RedisCluster::start_tls(&arguments, &ca_file);
        let url = cluster.url();
        assert!(url.starts_with("rediss+cluster://"), "{url}");

        for algorithm in Algorithm::ALL {
            let redis = RedisRateLimiter::builder(url.clone(), algorithm)
                .plan("free", Rule::per_hour(3).unwrap())
                .key_prefix(format!("tls-{algorithm}"))
                .deny_cache(0)
                .timeout(std::time::Duration::from_secs(2))
                .connect_timeout(std::time::Duration::from_secs(5))
                .tls_root_certificate(ca.pem())
                .build()
                .await
                .unwrap();
            let mut masters = std::collections::BTreeSet::new();
            for index in 0..12 {
                let client = format!("client-{index}");
                let mut admitted = 0;
                for _ in 0..5 {
                    let answer = redis.decide(&client, &"free", 1).await.unwrap();
                    assert_eq!(answer.source(), Source::Redis, "{algorithm}");
                    admitted += u64::from(answer.decision().is_allowed());
                }
                assert_eq!(
                    admitted, 3,
                    "{algorithm}: {client} admitted {admitted} of 5"
                );
                let keys = redis.keys(&client, &"free").unwrap();
                masters.insert(cluster.node_holding(&keys[0]));
            }
            assert_eq!(masters.len(), 3, "{algorithm}: keys on masters {masters:?}");
        }

        let error = RedisRateLimiter::builder(url, Algorithm::TokenBucket)
            .plan("free", Rule::per_hour(3).unwrap())
            .build()
            .await
            .unwrap_err();
        assert!(
            matches!(error, RedisError::UntrustedCertificate { .. }),
            "{error:?}"
        );
    }
}
