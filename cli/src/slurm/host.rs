//! The submitting host as Slurm's commands record it in a job: its name (`SLURM_SUBMIT_HOST`) and the submitting
//! process's scheduling priority (`SLURM_PRIO_PROCESS`); and the whole context of a submission from this process.

use crate::sbatch_args::SubmitContext;

/// A submission from this process (sbatch, srun, salloc, the demo): its user, the local clock and where it comes
/// from, with the working directory and environment the command passes. `sbatch_env`: whether the `SBATCH_*`
/// input variables apply (sbatch's only).
pub fn submit_context(cwd: String, env: Vec<(String, String)>, sbatch_env: bool) -> SubmitContext {
    let (user, uid, gid) = crate::identity::current_user();
    let (now_ms, utc_offset_s) = crate::slurm::time::local_clock();
    SubmitContext { user, uid, gid, cwd, env, now_ms, utc_offset_s, sbatch_env, submission: Some(submission()) }
}

/// This host's name (`localhost` when the C library cannot tell).
pub fn host_name() -> String {
    let mut buf = [0 as libc::c_char; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into `buf`.
    if unsafe { libc::gethostname(buf.as_mut_ptr(), buf.len()) } != 0 {
        return "localhost".to_string();
    }
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated within `buf` (forced above).
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// This process's nice value, as Slurm's commands read it with getpriority for `SLURM_PRIO_PROCESS`.
pub fn nice_value() -> i32 {
    // SAFETY: getpriority has no memory-safety preconditions; who = 0 is this process.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

/// What a submission records of where it came from: the host's name and the process's nice value.
pub fn submission() -> (String, i32) {
    (host_name(), nice_value())
}
