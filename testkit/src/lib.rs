//! A local Drover cluster on this machine: replicas, node agents with simulated GPUs, the mutual-TLS material
//! they share, and who the current user is. `drover local up` starts one for people; the CLI's stories, the chaos
//! drills and the benchmarks start one for themselves, so none of them needs the CLI to reach it.

pub mod identity;
pub mod local;
pub mod pki;
pub mod previous;
