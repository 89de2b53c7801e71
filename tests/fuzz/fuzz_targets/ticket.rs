//! Any bytes as the body of a Flight `DoGet` request and as the ticket in
//! it, through every parser a ticket meets: the gRPC framing the direct
//! job streams read, job tickets, query tickets and checkpoint tickets.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_compute::direct::ticket_of;
use sluice_compute::trainer::is_job_ticket;
use sluice_compute::{JobTicket, QueryTicket};
use sluice_flight::checkpoint::GetTicket;

fn ticket(bytes: &[u8]) {
    if is_job_ticket(bytes) {
        let _ = serde_json::from_slice::<JobTicket>(bytes);
    }
    let _ = serde_json::from_slice::<QueryTicket>(bytes);
    let _ = GetTicket::parse(bytes);
}

fuzz_target!(|data: &[u8]| {
    ticket(data);
    if let Some(inner) = ticket_of(data) {
        ticket(&inner);
    }
});
