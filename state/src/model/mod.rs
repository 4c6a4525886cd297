//! The replicated data: jobs, nodes, the cluster's configuration and its registry (accounts, QOS, reservations,
//! roles), the audit log, and the bounded tables kept beside them. Types and the rules that belong to one value
//! (a job's resources, a node's free GPUs); what a command does to them is in [`crate::apply`].

pub mod account;
pub mod audit;
pub mod config;
pub mod container;
pub(crate) mod fate;
pub(crate) mod goodput_totals;
pub mod job;
pub mod node;
pub mod qos;
pub(crate) mod registry;
pub mod reservation;
pub mod role;
