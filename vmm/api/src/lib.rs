//! pvmm's control-socket protocol, shared by the three programs that speak it: the VMM that
//! serves it (`pvmm --api-socket`), `pvmm-ctl`, and the host daemon (`pvmm-host`), which is a
//! client of every pvmm VM and serves its own status the same way.
//!
//! - [`http`]: HTTP/1.1 framing (httparse), limits, responses;
//! - [`routes`]: paths and methods turned into checked [`routes::ApiRequest`]s;
//! - [`messages`]: the typed request and answer bodies;
//! - [`stats`]: the stats schema: a VM's `--stats` line (also `GET /v1/placement`) and the
//!   daemon's status (`GET /v1/host`), each one type that every writer and reader uses;
//! - [`client`]: a client connection and the tables `pvmm-ctl` prints;
//! - [`tool`]: what pvmm's command-line tools share (runtime directory, exit status, errors).
//!
//! This crate knows no KVM and no VM: a server implements its side on top of [`routes`].

pub mod client;
pub mod http;
pub mod messages;
pub mod routes;
pub mod stats;
mod text;
pub mod tool;
