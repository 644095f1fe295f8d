//! How this machine's idle cores wait: read from sysfs once at start-up, so that `obol serve`
//! can say when every wait of a call halts a core and wakes it through the host, and the
//! benchmark can name the regime its figures come from (ADR-0067).

use std::fmt;

/// The idle driver of this machine's cores.
const IDLE_DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";
/// How long a KVM guest's `haltpoll` idle driver polls before it halts an idle core.
const HALT_POLL_NS: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";
/// The clocks this kernel can use; a KVM guest offers `kvm-clock`.
const CLOCKSOURCES: &str = "/sys/devices/system/clocksource/clocksource0/available_clocksource";

/// How idle cores wait, as far as the latency of a call is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdleCores {
    /// KVM's `haltpoll` driver, which polls up to this long before it halts a core (0: it
    /// halts at once).
    Haltpoll { poll_ns: u64 },
    /// A KVM guest that runs no idle driver: the kernel halts an idle core at once. The
    /// kernel's `haltpoll` driver registers itself on a KVM guest only when the host hints a
    /// real-time guest, or when booted with `cpuidle_haltpoll.force=1`.
    KvmGuestWithoutDriver,
    /// Any other driver, by name (bare metal's `intel_idle`, `acpi_idle`, …).
    Other(String),
    /// Nothing readable (not Linux, or sysfs not mounted).
    Unknown,
}

impl IdleCores {
    pub fn read() -> IdleCores {
        let read = |path| std::fs::read_to_string(path).ok();
        IdleCores::of(
            read(IDLE_DRIVER).as_deref(),
            read(HALT_POLL_NS).as_deref(),
            read(CLOCKSOURCES).as_deref(),
        )
    }

    /// From the three files' text (`None`: unreadable).
    fn of(driver: Option<&str>, poll_ns: Option<&str>, clocksources: Option<&str>) -> IdleCores {
        let kvm_guest =
            clocksources.is_some_and(|all| all.split_whitespace().any(|c| c == "kvm-clock"));
        match driver.map(str::trim) {
            Some("haltpoll") => match poll_ns.and_then(|ns| ns.trim().parse().ok()) {
                Some(poll_ns) => IdleCores::Haltpoll { poll_ns },
                None => IdleCores::Other("haltpoll".into()),
            },
            Some("none") if kvm_guest => IdleCores::KvmGuestWithoutDriver,
            Some(other) if !other.is_empty() => IdleCores::Other(other.into()),
            _ => IdleCores::Unknown,
        }
    }

    /// What `obol serve` says once at start-up when idle cores halt as soon as a call waits on
    /// a KVM guest: each of a call's waits then costs a wake-up through the host (measured in
    /// ADR-0067). How to change it is in docs/operations.md ("Latency on virtual machines");
    /// the gateway does not spin to keep its cores awake itself.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            IdleCores::Haltpoll { poll_ns: 0 } => Some(
                "idle cores halt at once on this virtual machine (cpuidle haltpoll, \
                 guest_halt_poll_ns=0): each wait of a call costs a wake-up through the host; \
                 see docs/operations.md, \"Latency on virtual machines\", to trade idle CPU for \
                 latency",
            ),
            IdleCores::KvmGuestWithoutDriver => Some(
                "idle cores halt at once on this virtual machine (a KVM guest with no cpuidle \
                 driver): each wait of a call costs a wake-up through the host; booting with \
                 cpuidle_haltpoll.force=1 lets them poll first, see docs/operations.md, \
                 \"Latency on virtual machines\"",
            ),
            IdleCores::Haltpoll { .. } | IdleCores::Other(_) | IdleCores::Unknown => None,
        }
    }
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
            IdleCores::KvmGuestWithoutDriver => {
                write!(f, "no driver on a KVM guest, halting at once")
            }
            IdleCores::Other(driver) => write!(f, "driver {driver}"),
            IdleCores::Unknown => write!(f, "driver unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::IdleCores;

    const KVM: Option<&str> = Some("tsc kvm-clock \n");

    #[test]
    fn a_kvm_guest_whose_idle_cores_halt_at_once_is_told_so() {
        for (driver, poll_ns) in [("haltpoll\n", Some("0\n")), ("haltpoll", Some(" 0 "))] {
            let idle = IdleCores::of(Some(driver), poll_ns, KVM);
            assert_eq!(idle, IdleCores::Haltpoll { poll_ns: 0 });
            let hint = idle.hint().expect("a hint");
            assert!(hint.contains("guest_halt_poll_ns=0"), "{hint}");
            assert!(hint.contains("Latency on virtual machines"), "{hint}");
        }
        // This project's reference machine on 2026-12-05: no driver; the built-in haltpoll
        // driver's polling is set (200000) but unused.
        let idle = IdleCores::of(Some("none\n"), Some("200000\n"), KVM);
        assert_eq!(idle, IdleCores::KvmGuestWithoutDriver);
        let hint = idle.hint().expect("a hint");
        assert!(hint.contains("cpuidle_haltpoll.force=1"), "{hint}");
        assert!(hint.contains("Latency on virtual machines"), "{hint}");
    }

    #[test]
    fn no_hint_where_idle_cores_poll_or_the_machine_is_not_a_kvm_guest() {
        for (driver, poll_ns, clocksources, expected) in [
            (
                Some("haltpoll\n"),
                Some("200000\n"),
                KVM,
                IdleCores::Haltpoll { poll_ns: 200_000 },
            ),
            (
                Some("intel_idle\n"),
                Some("0\n"),
                Some("tsc hpet acpi_pm\n"),
                IdleCores::Other("intel_idle".into()),
            ),
            // No driver, but not a KVM guest: the haltpoll driver would not load there.
            (
                Some("none\n"),
                None,
                Some("tsc hpet\n"),
                IdleCores::Other("none".into()),
            ),
            (Some("none\n"), None, None, IdleCores::Other("none".into())),
            (
                Some("acpi_idle\n"),
                None,
                KVM,
                IdleCores::Other("acpi_idle".into()),
            ),
            (None, None, None, IdleCores::Unknown),
            (Some("\n"), None, KVM, IdleCores::Unknown),
            (
                Some("haltpoll\n"),
                None,
                KVM,
                IdleCores::Other("haltpoll".into()),
            ),
            (
                Some("haltpoll\n"),
                Some("not a number"),
                KVM,
                IdleCores::Other("haltpoll".into()),
            ),
        ] {
            let idle = IdleCores::of(driver, poll_ns, clocksources);
            assert_eq!(idle, expected, "{driver:?} {poll_ns:?} {clocksources:?}");
            assert_eq!(idle.hint(), None, "{idle:?}");
        }
    }

    #[test]
    fn the_benchmark_names_each_regime() {
        let named = |driver, poll_ns| IdleCores::of(Some(driver), poll_ns, KVM).to_string();
        assert_eq!(
            named("haltpoll", Some("0")),
            "driver haltpoll, halting at once (guest_halt_poll_ns=0)"
        );
        assert_eq!(
            named("haltpoll", Some("200000")),
            "driver haltpoll, polling up to 200000 ns before halting"
        );
        assert_eq!(
            named("none", None),
            "no driver on a KVM guest, halting at once"
        );
        assert_eq!(named("intel_idle", None), "driver intel_idle");
    }
}
