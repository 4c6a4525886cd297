//! One replica of the Drover controller.

pub mod api;
pub mod config;
pub mod http;
pub mod leader;
pub mod leader_watch;
pub mod network;
pub mod propose;
pub mod raft_service;
pub mod recovery;
pub mod runtime;
pub mod security;
pub mod server;
pub mod store;
pub mod types;

pub use config::ControllerConfig;
pub use server::Controller;
