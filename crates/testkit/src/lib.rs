//! What toolgate's own tests share. [`browser`]: the approver's page in a real browser.

pub mod browser;

/// A TCP port free on 127.0.0.1 at the moment of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
