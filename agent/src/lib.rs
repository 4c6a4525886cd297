//! The node agent (`drover-agent`): GPU discovery, registration and heartbeats to the leader, and task
//! launch under per-task supervisors that outlive an agent restart.

pub mod cdi;
pub mod cgroup;
pub mod config;
pub mod container;
pub mod env;
pub mod gpu;
pub mod health_check;
pub mod image;
pub mod journal;
pub mod launch;
pub mod lease;
pub mod marker;
pub mod metrics;
pub mod node;
pub mod patterns;
pub mod session;
pub mod step_input;
pub mod steps;
pub mod supervise;
pub mod userfile;
pub mod xid;
