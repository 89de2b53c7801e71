//! Any bytes as the body of a Flight `DoGet` request and as the ticket in
//! it, through every parser a ticket meets: the gRPC framing the direct
//! job streams read and the one tagged ticket (job, query, checkpoint).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_compute::direct::ticket_of;
use sluice_flight::Ticket;

fuzz_target!(|data: &[u8]| {
    let _ = Ticket::parse(data);
    if let Some(inner) = ticket_of(data) {
        let _ = Ticket::parse(&inner);
    }
});
