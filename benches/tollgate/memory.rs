//! Memory per client: the heap a keyed limiter holds for each idle client, measured with the
//! counting allocator (criterion measures only time). For each method of the service, next to
//! governor's keyed limiter and the mutex map.
//!
//! Each map is made inside the count, empty and default-sized (tollgate's service of a capacity
//! of exactly the clients, its fixed table allocated when it is built); the heap it holds once
//! 100 000 clients have made one request each (and then idle) is divided by 100 000. That
//! includes the map's own table at the load it happens to be at, and anything the map has not
//! yet freed (papaya reclaims the tables it outgrew in batches). The table is printed and written to `memory.json` in criterion's
//! output directory, where the report finds it.

use std::fmt::Write as _;

use tollgate::{Algorithm, Rule};

use crate::alloc_counter::{HeapGrowth, measure_heap_growth};
use crate::ids::{GOVERNOR, MUTEX, TOLLGATE};
use crate::peers::{self, GovernorKeyed};
use crate::service::{KeyedLimiter, MutexMap, TollgateService};

const IDLE_CLIENTS: u64 = 100_000;

/// The benchmark id that a criterion filter must match for this report to run.
pub(crate) const ID: &str = "memory/per_client";

/// One row of the table.
struct Footprint {
    method: &'static str,
    implementation: &'static str,
    growth: HeapGrowth,
}

impl Footprint {
    fn per_client(bytes: i64) -> f64 {
        bytes as f64 / IDLE_CLIENTS as f64
    }
}

/// Measures every row, prints the table, and (if `write_json`) writes `memory.json`.
pub(crate) fn report(write_json: bool) {
    // 100 per second: a typical plan, and a sliding log ring of 100 slots (800 bytes).
    let rule = Rule::per_second(100).expect("valid rule");
    let mut rows = Vec::new();
    for algorithm in Algorithm::ALL {
        rows.push(Footprint {
            method: algorithm.name(),
            implementation: TOLLGATE,
            growth: grow(|| TollgateService::with_capacity(algorithm, rule, IDLE_CLIENTS)),
        });
    }
    rows.push(Footprint {
        method: Algorithm::TokenBucket.name(),
        implementation: GOVERNOR,
        growth: grow(|| GovernorKeyed::keyed(peers::quota(rule))),
    });
    rows.push(Footprint {
        method: Algorithm::TokenBucket.name(),
        implementation: MUTEX,
        growth: grow(|| MutexMap::new(rule)),
    });

    println!("\n{ID}: heap per idle client, {IDLE_CLIENTS} clients of rule {rule}, u64 keys");
    println!(
        "{:<20} {:<10} {:>16} {:>22} {:>18}",
        "method", "impl", "bytes requested", "bytes with malloc hdr", "allocations"
    );
    for row in &rows {
        println!(
            "{:<20} {:<10} {:>16.1} {:>22.1} {:>18.2}",
            row.method,
            row.implementation,
            Footprint::per_client(row.growth.requested_bytes),
            Footprint::per_client(row.growth.chunk_bytes),
            Footprint::per_client(row.growth.allocations),
        );
    }

    if !write_json {
        return;
    }
    let directory = crate::results::criterion_dir();
    let path = directory.join(crate::results::MEMORY_JSON);
    let written = std::fs::create_dir_all(&directory)
        .and_then(|()| std::fs::write(&path, to_json(&rows, rule)));
    match written {
        Ok(()) => println!("written to {}\n", path.display()),
        Err(error) => eprintln!("could not write {}: {error}", path.display()),
    }
}

/// The heap the map `make` makes holds once every idle client has made its first request.
fn grow<M: KeyedLimiter>(make: impl FnOnce() -> M) -> HeapGrowth {
    let mut kept = None;
    let growth = measure_heap_growth(|| {
        let map = make();
        for client in 0..IDLE_CLIENTS {
            assert!(map.allow(client), "a first request is admitted");
        }
        // Dropped after the count: its heap is what it holds.
        kept = Some(map);
    });
    drop(kept);
    growth
}

/// The rows as JSON, by hand: the bench has no JSON dependency of its own.
fn to_json(rows: &[Footprint], rule: Rule) -> String {
    let mut json = format!(
        "{{\n  \"idle_clients\": {IDLE_CLIENTS},\n  \"rule\": \"{rule}\",\n  \"rows\": [\n"
    );
    for (index, row) in rows.iter().enumerate() {
        let separator = if index + 1 == rows.len() { "" } else { "," };
        let _ = writeln!(
            json,
            "    {{\"method\": \"{}\", \"implementation\": \"{}\", \"requested_bytes_per_client\": {:.2}, \
             \"malloc_bytes_per_client\": {:.2}, \"allocations_per_client\": {:.3}}}{separator}",
            row.method,
            row.implementation,
            Footprint::per_client(row.growth.requested_bytes),
            Footprint::per_client(row.growth.chunk_bytes),
            Footprint::per_client(row.growth.allocations),
        );
    }
    json.push_str("  ]\n}\n");
    json
}
