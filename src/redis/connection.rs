//! The connection a limiter talks through: to one server, or to a Redis Cluster.
//!
//! Both kinds are made without waiting (the first command connects) and answer through
//! [`ConnectionLike`], so that scripts are loaded and invoked alike on both.

use std::fmt;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::{ClusterClientBuilder, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, Value};

/// The URL schemes naming a cluster: any of its nodes, comma separated.
const CLUSTER_SCHEMES: [(&str, &str); 2] = [
    ("redis+cluster://", "redis://"),
    ("rediss+cluster://", "rediss://"),
];

/// What the connection is made from: the URL and the limiter's bounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct ConnectionSettings<'a> {
    pub(super) url: &'a str,
    /// Bounds one command (a redirected one with its retries, on a cluster).
    pub(super) response_timeout: Duration,
    /// Bounds establishing each connection.
    pub(super) connect_timeout: Duration,
    /// A PEM certificate to trust instead of the system's roots (TLS only).
    #[cfg_attr(not(feature = "redis-tls"), allow(dead_code))]
    pub(super) root_certificate: Option<&'a [u8]>,
}

/// A connection to one server or to a cluster; clones share it.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server, through a manager that reconnects in the background.
    Server(ConnectionManager),
    /// A cluster, whose client routes each command to the master of its key's slot and follows
    /// `MOVED` and `ASK`.
    Cluster(ClusterConnection),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Connection::Server(_) => "Connection::Server",
            Connection::Cluster(_) => "Connection::Cluster",
        })
    }
}

impl Connection {
    /// A connection for `settings.url`, made on first use. Must be called within a tokio
    /// runtime. The error is the client library's: an invalid URL, or settings it refuses.
    pub(super) fn open(settings: &ConnectionSettings<'_>) -> RedisResult<Connection> {
        match cluster_nodes(settings.url)? {
            Some(nodes) => {
                let builder = ClusterClientBuilder::new(nodes)
                    .connection_timeout(settings.connect_timeout)
                    .response_timeout(settings.response_timeout)
                    // A redirect takes one retry; a lost node is retried by the next requests
                    // (the circuit breaker paces them), not by a backoff that holds requests up.
                    .retries(2)
                    .min_retry_wait(1)
                    .max_retry_wait(10);
                #[cfg(feature = "redis-tls")]
                let builder = match settings.root_certificate {
                    Some(root) => builder.certs(tls_certificates(root)),
                    None => builder,
                };
                let client = builder.build()?;
                let config = ClusterConfig::new()
                    .set_connection_timeout(settings.connect_timeout)
                    .set_response_timeout(settings.response_timeout);
                Ok(Connection::Cluster(
                    client.get_pending_async_connection_with_config(config),
                ))
            }
            None => {
                let client = server_client(settings)?;
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(settings.response_timeout))
                    .set_connection_timeout(Some(settings.connect_timeout))
                    // Reconnection is retried by the next requests (the circuit breaker paces
                    // them), not by a long backoff inside the client that would hold requests up.
                    .set_number_of_retries(1);
                Ok(Connection::Server(ConnectionManager::new_lazy_with_config(
                    client, config,
                )?))
            }
        }
    }

    /// Whether this is a cluster's connection.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }
}

/// Whether `url` names a cluster (`redis+cluster://` or `rediss+cluster://`).
pub(super) fn is_cluster_url(url: &str) -> bool {
    CLUSTER_SCHEMES
        .iter()
        .any(|(cluster, _)| url.starts_with(cluster))
}

/// The error of a connection to the first node a cluster URL names, made as the cluster's
/// client makes its connections (the same TLS roots, credentials and timeout), if that fails:
/// the cluster's client answers a failure to reach every node without its cause (an untrusted
/// certificate, refused credentials), which this one keeps. `None` for a URL of one server, or
/// when the node answers.
pub(super) async fn first_node_error(
    settings: &ConnectionSettings<'_>,
) -> Option<::redis::RedisError> {
    let nodes = cluster_nodes(settings.url).ok()??;
    let first = nodes.first()?;
    let client = match server_client(&ConnectionSettings {
        url: first,
        ..*settings
    }) {
        Ok(client) => client,
        Err(error) => return Some(error),
    };
    let connect = client.get_multiplexed_async_connection();
    match tokio::time::timeout(settings.connect_timeout, connect).await {
        Ok(Err(error)) => Some(error),
        Ok(Ok(_)) | Err(_) => None,
    }
}

fn server_client(settings: &ConnectionSettings<'_>) -> RedisResult<::redis::Client> {
    #[cfg(feature = "redis-tls")]
    if let Some(root) = settings.root_certificate {
        return ::redis::Client::build_with_tls(settings.url, tls_certificates(root));
    }
    ::redis::Client::open(settings.url)
}

#[cfg(feature = "redis-tls")]
fn tls_certificates(root: &[u8]) -> ::redis::TlsCertificates {
    ::redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root.to_vec()),
    }
}

/// The node URLs of a cluster URL (`redis+cluster://[user:password@]host:port[,host:port...][/db]`,
/// or `rediss+cluster://` for TLS), each as a single-node URL with the same credentials and
/// database; `None` for a URL of one server.
pub(super) fn cluster_nodes(url: &str) -> RedisResult<Option<Vec<String>>> {
    let Some((rest, scheme)) = CLUSTER_SCHEMES
        .iter()
        .find_map(|&(cluster, node)| Some((url.strip_prefix(cluster)?, node)))
    else {
        return Ok(None);
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| format!("{scheme}{userinfo}{host}{path}"))
        .collect();
    if nodes.is_empty() {
        return Err((
            ErrorKind::InvalidClientConfig,
            "a cluster URL names at least one node: redis+cluster://host:port[,host:port...]",
        )
            .into());
    }
    Ok(Some(nodes))
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Server(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Server(connection) => connection.req_packed_commands(cmd, offset, count),
            Connection::Cluster(connection) => connection.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Server(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_each_node_with_the_same_credentials_and_database() {
        assert_eq!(cluster_nodes("redis://127.0.0.1:6379").unwrap(), None);
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7000").unwrap(),
            Some(vec!["redis://127.0.0.1:7000".to_owned()])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://u:p@a:1,b:2/0").unwrap(),
            Some(vec![
                "rediss://u:p@a:1/0".to_owned(),
                "rediss://u:p@b:2/0".to_owned()
            ])
        );
        assert!(cluster_nodes("redis+cluster://").is_err());
        assert!(cluster_nodes("redis+cluster://,/0").is_err());
    }
}
