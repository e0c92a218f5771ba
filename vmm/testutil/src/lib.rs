//! What pvmm's test crates share: the one rule for a test that needs something of the machine
//! (`/dev/kvm`, `iasl`, QEMU and the nested rig, Prometheus, libvirt, a cgroup cpuset).
//!
//! Where it is missing, the test skips with a loud banner on stderr, so that a developer's
//! run says what it did not check; where its `PVMM_REQUIRE_*` variable is `1` (CI sets them
//! all, `.ci/run`), the test fails instead, so that nothing is skipped silently there. Each
//! need names its variable once, here.
//!
//! A dev-dependency of every test crate (and a dependency of `pvmm-tests`' helpers); it
//! depends on nothing. [`alloc_count`] holds the allocation counter of the tests of code
//! that must allocate nothing once warm.

pub mod alloc_count;

/// Something of the machine a test needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A usable `/dev/kvm` (the tiny-guest tests), and root where a test makes taps.
    Kvm,
    /// `iasl` (Debian's `acpica-tools`), which disassembles the ACPI tables.
    Iasl,
    /// QEMU and what the QEMU-nested rig builds its images from.
    Rig,
    /// `promtool` and `prometheus` (Debian's `prometheus`).
    Promtool,
    /// libvirt's daemon, QEMU driver and client, run as root.
    Libvirt,
    /// A cgroup cpuset the test can make (root, two CPUs or more).
    Cgroup,
}

impl Need {
    /// The environment variable that turns a skip for this need into a failure.
    pub const fn env(self) -> &'static str {
        match self {
            Need::Kvm => "PVMM_REQUIRE_KVM",
            Need::Iasl => "PVMM_REQUIRE_IASL",
            Need::Rig => "PVMM_REQUIRE_RIG",
            Need::Promtool => "PVMM_REQUIRE_PROMTOOL",
            Need::Libvirt => "PVMM_REQUIRE_LIBVIRT",
            Need::Cgroup => "PVMM_REQUIRE_CGROUP",
        }
    }

    /// What it is, for the banner and the failure.
    pub const fn what(self) -> &'static str {
        match self {
            Need::Kvm => "/dev/kvm",
            Need::Iasl => "iasl",
            Need::Rig => "QEMU-nested rig",
            Need::Promtool => "Prometheus",
            Need::Libvirt => "libvirt",
            Need::Cgroup => "cgroup cpuset",
        }
    }

    /// Whether tests that need it must run (its variable is `1`): fail instead of skipping.
    pub fn required(self) -> bool {
        std::env::var(self.env()).is_ok_and(|v| v == "1")
    }
}

/// Reports that `test` cannot have `need` because of `reason`: panics when the need is
/// [`Need::required`], else prints a loud SKIPPED banner on stderr and returns, and the test
/// returns at once.
pub fn require_or_skip(need: Need, test: &str, reason: &str) {
    report(need, need.required(), test, reason);
}

/// `Some(value)` when `found` holds it; else [`require_or_skip`] and None.
pub fn found_or_skip<T>(need: Need, test: &str, found: Result<T, String>) -> Option<T> {
    match found {
        Ok(value) => Some(value),
        Err(reason) => {
            require_or_skip(need, test, &reason);
            None
        }
    }
}

/// [`require_or_skip`] with whether the need is required given.
fn report(need: Need, required: bool, test: &str, reason: &str) {
    let (env, what) = (need.env(), need.what());
    if required {
        panic!("{test}: {what} is required ({env}=1) but unavailable: {reason}");
    }
    eprintln!("{}", banner(test, what, reason, env));
}

/// The skip's banner, made to stand out among the passing tests' lines.
fn banner(test: &str, what: &str, reason: &str, env: &str) -> String {
    let rule = "!".repeat(72);
    format!(
        "\n{rule}\n\
         !!! SKIPPED {test}: {what} unavailable\n\
         !!! {reason}\n\
         !!! (set {env}=1 to fail instead)\n\
         {rule}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_names_the_test_the_reason_and_the_variable() {
        let text = banner(
            "acpi_dump",
            Need::Iasl.what(),
            "not installed",
            Need::Iasl.env(),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "!".repeat(72));
        assert_eq!(lines[2], "!!! SKIPPED acpi_dump: iasl unavailable");
        assert_eq!(lines[3], "!!! not installed");
        assert_eq!(lines[4], "!!! (set PVMM_REQUIRE_IASL=1 to fail instead)");
        report(Need::Iasl, false, "acpi_dump", "not installed");
    }

    #[test]
    #[should_panic(
        expected = "libvirt: libvirt is required (PVMM_REQUIRE_LIBVIRT=1) but unavailable: not root"
    )]
    fn a_required_need_fails_the_test() {
        report(Need::Libvirt, true, "libvirt", "not root");
    }

    #[test]
    fn a_found_need_is_handed_back() {
        assert_eq!(
            found_or_skip(Need::Cgroup, "t", Ok::<_, String>(7)),
            Some(7)
        );
    }
}
