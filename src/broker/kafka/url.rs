//! `kafka://host:port[,host:port…][?property=value&…]`: the bootstrap list,
//! and librdkafka properties for the connection itself (SASL, TLS), which
//! may not override what the relay sets itself.

use rdkafka::ClientConfig;

/// Settings the sink sets itself; a URL may not override them.
const OWN_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "transactional.id",
    "enable.idempotence",
    "acks",
    "transaction.timeout.ms",
    "isolation.level",
    "group.id",
    "enable.auto.commit",
    "partitioner",
];

/// A parsed `kafka://host:port[,host:port…][?property=value&…]` URL: the
/// bootstrap list, and librdkafka properties for the connection itself
/// (`security.protocol`, `sasl.mechanism`, `sasl.username`,
/// `sasl.password`, `ssl.ca.location`…), percent-decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaUrl {
    pub bootstrap: String,
    pub properties: Vec<(String, String)>,
}

impl KafkaUrl {
    pub fn parse(url: &str) -> Result<Self, String> {
        let masked = crate::secret::mask_url(url);
        let rest = url
            .strip_prefix("kafka://")
            .ok_or_else(|| format!("a Kafka sink URL starts with kafka://, got {masked:?}"))?;
        let (servers, query) = rest.split_once('?').unwrap_or((rest, ""));
        let servers = servers.strip_suffix('/').unwrap_or(servers);
        let mut bootstrap = Vec::new();
        for server in servers.split(',') {
            let bad = || format!("ONCEGATE_RELAY_SINK: {server:?} in {masked:?} is not host:port");
            let (host, port) = server.rsplit_once(':').ok_or_else(bad)?;
            if host.is_empty() || host.contains(['/', '@', ' ']) || port.parse::<u16>().is_err() {
                return Err(bad());
            }
            bootstrap.push(server);
        }
        let mut properties = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').ok_or_else(|| {
                format!(
                    "ONCEGATE_RELAY_SINK: {:?} in the query of {masked:?} is not property=value",
                    pair.split('=').next().unwrap_or("")
                )
            })?;
            let well_formed = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_');
            if !well_formed {
                return Err(format!(
                    "ONCEGATE_RELAY_SINK: {name:?} in {masked:?} is not a librdkafka property name"
                ));
            }
            if OWN_PROPERTIES.contains(&name) {
                return Err(format!(
                    "ONCEGATE_RELAY_SINK: {name} is set by the relay and cannot be given in the URL"
                ));
            }
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| format!("ONCEGATE_RELAY_SINK: the value of {name} is not UTF-8"))?;
            properties.push((name.to_string(), value.into_owned()));
        }
        Ok(Self {
            bootstrap: bootstrap.join(","),
            properties,
        })
    }

    /// A client configuration reaching these brokers with these properties.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap)
            .set("log_level", "3");
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::KafkaUrl;

    #[test]
    fn kafka_urls_name_host_port_lists() {
        let bootstrap = |url: &str| KafkaUrl::parse(url).map(|u| u.bootstrap);
        assert_eq!(bootstrap("kafka://127.0.0.1:9092").unwrap(), "127.0.0.1:9092");
        assert_eq!(bootstrap("kafka://a:1,b:2/").unwrap(), "a:1,b:2");
        for bad in [
            "kafka://",
            "kafka://broker",
            "kafka://a:1,b",
            "kafka://a:x",
            "kafka://a:1/topic",
            "kafka://:9092",
        ] {
            let err = bootstrap(bad).unwrap_err();
            assert!(err.contains("host:port"), "{bad}: {err}");
        }
    }

    #[test]
    fn kafka_url_queries_are_librdkafka_properties() {
        let url = KafkaUrl::parse(
            "kafka://b1:9093,b2:9093?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-512\
             &sasl.username=relay&sasl.password=p%40ss%26word",
        )
        .unwrap();
        assert_eq!(url.bootstrap, "b1:9093,b2:9093");
        assert_eq!(
            url.properties,
            [
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "relay"),
                ("sasl.password", "p@ss&word"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        for (bad, says) in [
            ("kafka://b:1?acks=1", "set by the relay"),
            ("kafka://b:1?transactional.id=x", "set by the relay"),
            ("kafka://b:1?Sasl.Mechanism=PLAIN", "not a librdkafka property"),
            ("kafka://b:1?sasl.password", "not property=value"),
        ] {
            let err = KafkaUrl::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let err = KafkaUrl::parse("kafka://b?sasl.password=hunter2").unwrap_err();
        assert!(!err.contains("hunter2"), "the password is masked: {err}");
    }
}
