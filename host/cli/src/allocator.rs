//! The daemon's malloc settings, set once at start (glibc on Linux only; other allocators
//! return memory as they see fit).
//!
//! - **mmap threshold, 8 MiB.** Buffers of 8 MiB and more (a stored frame read whole, which a
//!   slab pins while it is copied) go back to the system when freed. glibc's default raises
//!   the threshold to the size of each such buffer freed, after which they come from the heap
//!   and stay there: a node whose cursors stalled on a dead child owner kept the memory of
//!   their first reads, 63 MiB per cursor where they hold 7.5
//!   (`narad bench fanout --stalled-cursors`).
//! - **trim threshold, 16 MiB.** Fixing the mmap threshold also switches off glibc's rule that
//!   keeps the trim threshold at twice it, which left it at 128 KiB: every free leaving more
//!   than that at the top of a heap handed it back to the kernel, and the slab-sized buffers
//!   of the next slab faulted it in again (about a fifth of a copy's CPU, more across nodes:
//!   `narad bench cluster`). Set as that rule would, each malloc arena keeps at most 16 MiB
//!   free at its top.
//!
//! An operator who sets either in the environment (`GLIBC_TUNABLES=glibc.malloc.…` or glibc's
//! older `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`) keeps their value.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub use glibc::tune;

/// Other allocators return memory as they see fit.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    /// One glibc malloc parameter the daemon sets.
    #[derive(Clone, Copy, Debug)]
    struct Setting {
        /// Its name in `GLIBC_TUNABLES`.
        tunable: &'static str,
        /// glibc's older environment variable for it.
        legacy_env: &'static str,
        /// Its `mallopt` parameter.
        param: libc::c_int,
        /// The value the daemon sets.
        value: libc::c_int,
    }

    /// The parameters, in the order they are set.
    const SETTINGS: [Setting; 2] = [
        Setting {
            tunable: "glibc.malloc.mmap_threshold",
            legacy_env: "MALLOC_MMAP_THRESHOLD_",
            param: libc::M_MMAP_THRESHOLD,
            value: 8 << 20,
        },
        Setting {
            tunable: "glibc.malloc.trim_threshold",
            legacy_env: "MALLOC_TRIM_THRESHOLD_",
            param: libc::M_TRIM_THRESHOLD,
            value: 16 << 20,
        },
    ];

    /// Sets the daemon's malloc parameters (module doc), leaving any the environment sets.
    pub fn tune() {
        let env = |name: &str| std::env::var(name).ok();
        for setting in SETTINGS {
            if set_by_environment(&setting, env) {
                continue;
            }
            // SAFETY: mallopt sets one allocator parameter (under the allocator's own lock) and
            // touches no memory of ours.
            unsafe {
                libc::mallopt(setting.param, setting.value);
            }
        }
    }

    /// Whether the environment `env` gives `setting` a value glibc read at start.
    fn set_by_environment(setting: &Setting, env: impl Fn(&str) -> Option<String>) -> bool {
        let tunable = env("GLIBC_TUNABLES").is_some_and(|list| {
            list.split(':').any(|item| {
                item.split_once('=')
                    .is_some_and(|(name, _)| name == setting.tunable)
            })
        });
        tunable || env(setting.legacy_env).is_some()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const TRIM: Setting = SETTINGS[1];

        fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        }

        #[test]
        fn an_operators_tunable_or_legacy_variable_is_kept() {
            let tunables = "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=1048576";
            assert!(set_by_environment(
                &TRIM,
                env_of(&[("GLIBC_TUNABLES", tunables)])
            ));
            assert!(set_by_environment(
                &TRIM,
                env_of(&[("MALLOC_TRIM_THRESHOLD_", "0")])
            ));
        }

        #[test]
        fn other_tunables_or_none_leave_the_setting_to_the_daemon() {
            assert!(!set_by_environment(&TRIM, env_of(&[])));
            let others = "glibc.malloc.mmap_threshold=1048576:glibc.malloc.trim_threshold_x=1";
            assert!(!set_by_environment(
                &TRIM,
                env_of(&[("GLIBC_TUNABLES", others)])
            ));
            assert!(!set_by_environment(
                &TRIM,
                env_of(&[("MALLOC_MMAP_THRESHOLD_", "1")])
            ));
        }
    }
}
