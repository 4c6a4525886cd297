//! One replica of the Drover controller.

pub mod agents;
pub mod api;
pub mod config;
pub mod network;
pub mod planner;
pub mod raft_service;
pub mod runtime;
pub mod scheduling;
pub mod security;
pub mod server;
pub mod store;
pub mod types;

pub use config::ControllerConfig;
pub use server::Controller;
