//! How this machine's idle cores wait: read from sysfs and the kernel's command line at
//! start-up, so that `obol serve` can say when every wait of a call halts a core and wakes it
//! through the host, and the benchmark can name the regime its figures come from (ADR-0067).

use std::fmt;

/// The idle driver of this machine's cores.
const IDLE_DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";
/// How long a KVM guest's `haltpoll` idle driver polls before it halts an idle core.
const HALT_POLL_NS: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";
/// The clocks this kernel can use: `kvm-clock` registers only where `kvm_para_available()`, the
/// first condition of the kernel's `haltpoll` idle driver too.
const CLOCKSOURCES: &str = "/sys/devices/system/clocksource/clocksource0/available_clocksource";
/// Whether the kernel's built-in `haltpoll` idle driver was told to register (`Y`/`N`); absent
/// where the kernel has no such driver.
const HALTPOLL_FORCED: &str = "/sys/module/cpuidle_haltpoll/parameters/force";
/// The kernel's command line: an `idle=` override keeps every idle driver out.
const CMDLINE: &str = "/proc/cmdline";

/// Whether a KVM guest without an idle driver could have the kernel's `haltpoll` driver: it
/// registers only when the host hints a real-time guest, or when the guest boots with
/// `cpuidle_haltpoll.force=1`.
#[derive(Debug, PartialEq, Eq)]
pub enum HaltpollDriver {
    /// Built in and not forced: booting with `cpuidle_haltpoll.force=1` registers it.
    Forcible,
    /// Not in this kernel (or a module not loaded), or forced and still not registered.
    Unavailable,
}

/// How idle cores wait, as far as the latency of a call is concerned.
#[derive(Debug, PartialEq, Eq)]
pub enum IdleCores {
    /// KVM's `haltpoll` driver, which polls up to this long before it halts a core (0: it
    /// halts at once; under its own `haltpoll` governor, the default one).
    Haltpoll { poll_ns: u64 },
    /// A KVM guest that runs no idle driver and has no `idle=` override: the kernel halts an
    /// idle core at once.
    KvmGuestWithoutDriver { haltpoll: HaltpollDriver },
    /// An `idle=` override on the kernel's command line (`idle=poll` polls all the time,
    /// `idle=halt` halts at once), which keeps the idle drivers out.
    Override(String),
    /// Any other driver, by name (bare metal's `intel_idle`, `acpi_idle`, …, or `none` where
    /// the machine is not a KVM guest).
    Other(String),
    /// Nothing readable (not Linux, or sysfs not mounted).
    Unknown,
}

impl IdleCores {
    pub fn read() -> IdleCores {
        let read = |path| std::fs::read_to_string(path).ok();
        IdleCores::of(Files {
            driver: read(IDLE_DRIVER).as_deref(),
            poll_ns: read(HALT_POLL_NS).as_deref(),
            clocksources: read(CLOCKSOURCES).as_deref(),
            haltpoll_forced: read(HALTPOLL_FORCED).as_deref(),
            cmdline: read(CMDLINE).as_deref(),
        })
    }

    /// From the files' text (see [`Files`]).
    fn of(files: Files) -> IdleCores {
        let kvm_guest = files
            .clocksources
            .is_some_and(|all| all.split_whitespace().any(|c| c == "kvm-clock"));
        let idle_override = files.cmdline.and_then(|line| {
            line.split_whitespace()
                .find(|parameter| parameter.starts_with("idle="))
        });
        // An unreadable command line could hide an `idle=` override, which keeps the driver out.
        let haltpoll = match (files.haltpoll_forced.map(str::trim), files.cmdline) {
            (Some("N"), Some(_)) => HaltpollDriver::Forcible,
            _ => HaltpollDriver::Unavailable,
        };
        match files.driver.map(str::trim) {
            Some("haltpoll") => match files.poll_ns.and_then(|ns| ns.trim().parse().ok()) {
                Some(poll_ns) => IdleCores::Haltpoll { poll_ns },
                None => IdleCores::Other("haltpoll".into()),
            },
            Some("none") => match idle_override {
                Some(parameter) => IdleCores::Override(parameter.into()),
                None if kvm_guest => IdleCores::KvmGuestWithoutDriver { haltpoll },
                None => IdleCores::Other("none".into()),
            },
            Some(other) if !other.is_empty() => IdleCores::Other(other.into()),
            _ => IdleCores::Unknown,
        }
    }

    /// What `obol serve` says once at start-up when idle cores halt as soon as a call waits on
    /// a KVM guest and a remedy is known: each of a call's waits then costs a wake-up through the host (measured in
    /// ADR-0067). How to change it is in docs/operations.md ("Latency on virtual machines");
    /// the gateway does not spin to keep its cores awake itself.
    pub fn hint(&self) -> Option<String> {
        let (why, remedy) = match self {
            IdleCores::Haltpoll { poll_ns: 0 } => ("cpuidle haltpoll, guest_halt_poll_ns=0", ""),
            IdleCores::KvmGuestWithoutDriver {
                haltpoll: HaltpollDriver::Forcible,
            } => (
                "a KVM guest with no cpuidle driver",
                "booting with cpuidle_haltpoll.force=1 lets them poll first; ",
            ),
            // Without a remedy to offer, or where cores poll or halt by the operator's choice.
            IdleCores::KvmGuestWithoutDriver {
                haltpoll: HaltpollDriver::Unavailable,
            }
            | IdleCores::Haltpoll { .. }
            | IdleCores::Override(_)
            | IdleCores::Other(_)
            | IdleCores::Unknown => return None,
        };
        Some(format!(
            "idle cores halt at once on this virtual machine ({why}): each wait of a call costs \
             a wake-up through the host; {remedy}see docs/operations.md, \"Latency on virtual \
             machines\", to trade idle CPU for latency"
        ))
    }
}

/// The files [`IdleCores`] is read from, as text (`None`: unreadable or absent).
struct Files<'a> {
    driver: Option<&'a str>,
    poll_ns: Option<&'a str>,
    clocksources: Option<&'a str>,
    haltpoll_forced: Option<&'a str>,
    cmdline: Option<&'a str>,
}

impl fmt::Display for IdleCores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdleCores::Haltpoll { poll_ns: 0 } => {
                write!(f, "driver haltpoll, halting at once (guest_halt_poll_ns=0)")
            }
            IdleCores::Haltpoll { poll_ns } => {
                write!(
                    f,
                    "driver haltpoll, polling up to {poll_ns} ns before halting"
                )
            }
            IdleCores::KvmGuestWithoutDriver { .. } => {
                write!(f, "no driver on a KVM guest, halting at once")
            }
            IdleCores::Override(parameter) => write!(f, "{parameter} on the kernel's command line"),
            IdleCores::Other(driver) => write!(f, "driver {driver}"),
            IdleCores::Unknown => write!(f, "driver unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Files, HaltpollDriver, IdleCores};

    /// This project's reference machine on 2026-12-05: a KVM guest with no idle driver, whose
    /// built-in `haltpoll` driver did not register (its polling is set, but unused).
    fn reference_machine() -> Files<'static> {
        Files {
            driver: Some("none\n"),
            poll_ns: Some("200000\n"),
            clocksources: Some("tsc kvm-clock \n"),
            haltpoll_forced: Some("N\n"),
            cmdline: Some("console=ttyS0 quiet reboot=k panic=1 nomodule\n"),
        }
    }

    #[test]
    fn a_kvm_guest_whose_idle_cores_halt_at_once_is_told_so() {
        for poll_ns in ["0\n", " 0 "] {
            let idle = IdleCores::of(Files {
                driver: Some("haltpoll\n"),
                poll_ns: Some(poll_ns),
                ..reference_machine()
            });
            assert_eq!(idle, IdleCores::Haltpoll { poll_ns: 0 });
            let hint = idle.hint().expect("a hint");
            assert!(hint.contains("guest_halt_poll_ns=0"), "{hint}");
            assert!(!hint.contains("force"), "{hint}");
            assert!(hint.contains("Latency on virtual machines"), "{hint}");
        }
        let idle = IdleCores::of(reference_machine());
        assert_eq!(
            idle,
            IdleCores::KvmGuestWithoutDriver {
                haltpoll: HaltpollDriver::Forcible
            }
        );
        let hint = idle.hint().expect("a hint");
        assert!(hint.contains("no cpuidle driver"), "{hint}");
        assert!(hint.contains("cpuidle_haltpoll.force=1"), "{hint}");
        assert!(hint.contains("Latency on virtual machines"), "{hint}");
    }

    #[test]
    fn no_hint_where_idle_cores_poll_or_the_haltpoll_driver_could_not_help() {
        for (files, expected) in [
            (
                Files {
                    driver: Some("haltpoll\n"),
                    ..reference_machine()
                },
                IdleCores::Haltpoll { poll_ns: 200_000 },
            ),
            (
                Files {
                    driver: Some("intel_idle\n"),
                    poll_ns: Some("0\n"),
                    ..reference_machine()
                },
                IdleCores::Other("intel_idle".into()),
            ),
            // Not a KVM guest: the haltpoll driver does not register there.
            (
                Files {
                    clocksources: Some("tsc hpet acpi_pm\n"),
                    ..reference_machine()
                },
                IdleCores::Other("none".into()),
            ),
            // Cores that poll all the time, or halt by the operator's choice.
            (
                Files {
                    cmdline: Some("quiet idle=poll\n"),
                    ..reference_machine()
                },
                IdleCores::Override("idle=poll".into()),
            ),
            (
                Files {
                    cmdline: Some("idle=halt\n"),
                    ..reference_machine()
                },
                IdleCores::Override("idle=halt".into()),
            ),
            // A kernel without the haltpoll driver, or one told to register that did not:
            // halting at once, but nothing to suggest.
            (
                Files {
                    haltpoll_forced: None,
                    ..reference_machine()
                },
                IdleCores::KvmGuestWithoutDriver {
                    haltpoll: HaltpollDriver::Unavailable,
                },
            ),
            (
                Files {
                    haltpoll_forced: Some("Y\n"),
                    ..reference_machine()
                },
                IdleCores::KvmGuestWithoutDriver {
                    haltpoll: HaltpollDriver::Unavailable,
                },
            ),
            (
                Files {
                    cmdline: None,
                    ..reference_machine()
                },
                IdleCores::KvmGuestWithoutDriver {
                    haltpoll: HaltpollDriver::Unavailable,
                },
            ),
            (
                Files {
                    driver: Some("haltpoll\n"),
                    poll_ns: Some("not a number"),
                    ..reference_machine()
                },
                IdleCores::Other("haltpoll".into()),
            ),
            (
                Files {
                    driver: None,
                    ..reference_machine()
                },
                IdleCores::Unknown,
            ),
            (
                Files {
                    driver: Some("\n"),
                    ..reference_machine()
                },
                IdleCores::Unknown,
            ),
        ] {
            let idle = IdleCores::of(files);
            assert_eq!(idle, expected);
            assert_eq!(idle.hint(), None, "{idle:?}");
        }
    }

    /// The benchmark's first line, which names the regime every c=1 figure comes from.
    #[test]
    fn the_benchmark_names_each_regime() {
        let named = |files: Files| IdleCores::of(files).to_string();
        for (files, name) in [
            (
                Files {
                    driver: Some("haltpoll"),
                    poll_ns: Some("0"),
                    ..reference_machine()
                },
                "driver haltpoll, halting at once (guest_halt_poll_ns=0)",
            ),
            (
                Files {
                    driver: Some("haltpoll"),
                    ..reference_machine()
                },
                "driver haltpoll, polling up to 200000 ns before halting",
            ),
            (
                reference_machine(),
                "no driver on a KVM guest, halting at once",
            ),
            (
                Files {
                    haltpoll_forced: None,
                    ..reference_machine()
                },
                "no driver on a KVM guest, halting at once",
            ),
            (
                Files {
                    cmdline: Some("idle=poll"),
                    ..reference_machine()
                },
                "idle=poll on the kernel's command line",
            ),
            (
                Files {
                    driver: Some("intel_idle"),
                    ..reference_machine()
                },
                "driver intel_idle",
            ),
            (
                Files {
                    driver: None,
                    ..reference_machine()
                },
                "driver unknown",
            ),
        ] {
            assert_eq!(named(files), name);
        }
    }
}
