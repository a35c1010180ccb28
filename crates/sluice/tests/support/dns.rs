//! A real DNS server on loopback for the tests of names that follow DNS: hickory-server (the
//! server of the `hickory-dns` binary) answering UDP on 127.0.0.1:0 from an in-memory zone
//! whose records the test changes while the proxy runs.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::proto::rr::rdata::{A, SOA};
use hickory_server::proto::rr::{LowerName, Name, RData, Record, RecordSet, RecordType, RrKey};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};
use hickory_server::Server;
use tokio::net::UdpSocket;

type Zone = InMemoryZoneHandler<TokioRuntimeProvider>;

/// An authoritative server for one zone, serving until dropped.
pub struct TestDns {
    /// Where it answers (UDP).
    pub addr: SocketAddr,
    zone: Arc<Zone>,
    _server: Server<Catalog>,
}

impl TestDns {
    /// Serves `origin` (e.g. `"sluice.test."`), with no address records yet.
    pub async fn start(origin: &str) -> Self {
        let origin = Name::from_str(origin).unwrap();
        let soa = SOA::new(
            Name::from_str("ns.sluice.test.").unwrap(),
            Name::from_str("admin.sluice.test.").unwrap(),
            1,
            3600,
            600,
            86_400,
            0,
        );
        let mut records = BTreeMap::new();
        let soa = Record::from_rdata(origin.clone(), 0, RData::SOA(soa));
        records.insert(
            RrKey::new(LowerName::new(&origin), RecordType::SOA),
            RecordSet::from(soa),
        );
        let zone = Zone::new(origin.clone(), records, ZoneType::Primary, AxfrPolicy::Deny).unwrap();
        let zone = Arc::new(zone);
        let mut catalog = Catalog::new();
        let handler: Arc<dyn ZoneHandler> = zone.clone();
        catalog.upsert(LowerName::new(&origin), vec![handler]);
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let mut server = Server::new(catalog);
        server.register_socket(socket);
        Self {
            addr,
            zone,
            _server: server,
        }
    }

    /// `host` (a name in the zone, e.g. `"api.sluice.test."`) has these A records now, with
    /// this TTL in seconds.
    pub async fn set(&self, host: &str, addrs: &[Ipv4Addr], ttl: u32) {
        let name = Name::from_str(host).unwrap();
        let mut set = RecordSet::new(name.clone(), RecordType::A, 0);
        for ip in addrs {
            set.insert(Record::from_rdata(name.clone(), ttl, RData::A(A(*ip))), 0);
        }
        let key = RrKey::new(LowerName::new(&name), RecordType::A);
        self.zone.records_mut().await.insert(key, Arc::new(set));
    }

    /// `host` has no records any more: lookups of it answer NXDOMAIN.
    pub async fn remove(&self, host: &str) {
        let name = Name::from_str(host).unwrap();
        let key = RrKey::new(LowerName::new(&name), RecordType::A);
        self.zone.records_mut().await.remove(&key);
    }
}
