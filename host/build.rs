//! Builds the guest components the host embeds (first-party connectors) and the ones its tests
//! load (the hostile and misfit components), and exports their paths as `OBOL_GUEST_*`.
//!
//! The nested cargo uses its own target directory: sharing the outer one would deadlock on
//! cargo's build-directory lock.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

/// (package, features, exported name, artifact file stem)
const GUESTS: &[(&str, &str, &str)] = &[
    ("obol-connector-payments", "", "PAYMENTS"),
    ("obol-connector-payments", "next", "PAYMENTS_NEXT"),
    ("obol-connector-tracker", "", "TRACKER"),
    ("obol-connector-tracker", "next", "TRACKER_NEXT"),
    ("obol-connector-hostile", "", "HOSTILE"),
    ("obol-connector-nango", "", "NANGO"),
    ("obol-connector-composio", "", "COMPOSIO"),
    (
        "obol-connector-hostile",
        "misfit-dotted-name",
        "MISFIT_DOTTED_NAME",
    ),
    (
        "obol-connector-hostile",
        "misfit-empty-name",
        "MISFIT_EMPTY_NAME",
    ),
    (
        "obol-connector-hostile",
        "misfit-duplicate-tool",
        "MISFIT_DUPLICATE_TOOL",
    ),
    (
        "obol-connector-hostile",
        "misfit-bad-schema",
        "MISFIT_BAD_SCHEMA",
    ),
    ("obol-connector-hostile", "misfit-overlap", "MISFIT_OVERLAP"),
    (
        "obol-connector-hostile",
        "misfit-reserved-prefix",
        "MISFIT_RESERVED_PREFIX",
    ),
    (
        "obol-connector-hostile",
        "misfit-reserved-tool",
        "MISFIT_RESERVED_TOOL",
    ),
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_owned();
    // Relative to this package, not absolute: cargo's fingerprints do not depend on the
    // checkout's path, so two checkouts sharing a target directory would otherwise each watch
    // the other's sources and keep stale guests.
    for watched in [
        "wit",
        "sdk/obol-sdk",
        "connectors",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed=../{watched}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    ensure_wasm_target();

    // <target>/<profile>/build/<pkg>-<hash>/out -> <target>/obol-guests
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let guest_target = out_dir.ancestors().nth(4).unwrap().join("obol-guests");
    let artifacts = out_dir.join("guests");
    std::fs::create_dir_all(&artifacts).unwrap();

    for (package, features, name) in GUESTS {
        let mut cargo = nested_cargo(&root);
        cargo.args([
            "build",
            "--profile",
            "guest",
            "--target",
            TARGET,
            "-p",
            package,
        ]);
        cargo.arg("--target-dir").arg(&guest_target);
        if !features.is_empty() {
            cargo.args(["--features", features]);
        }
        let status = cargo.status().expect("run cargo for the guest components");
        assert!(
            status.success(),
            "building {package} {features} for {TARGET} failed"
        );
        let built = guest_target
            .join(TARGET)
            .join("guest")
            .join(format!("{}.wasm", package.replace('-', "_")));
        let kept = artifacts.join(format!("{}.wasm", name.to_lowercase()));
        std::fs::copy(&built, &kept).unwrap_or_else(|e| panic!("{}: {e}", built.display()));
        println!("cargo:rustc-env=OBOL_GUEST_{name}={}", kept.display());
    }
}

/// A cargo that does not inherit the outer build's settings: its target directory, target,
/// flags, features and profile overrides from the environment (a `CARGO_PROFILE_RELEASE_*`
/// variable would reach the guest profile, which inherits `release`); `CARGO_PROFILE_GUEST_*`,
/// aimed at this build, is kept.
fn nested_cargo(root: &Path) -> Command {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(root);
    for (key, _) in env::vars() {
        let inherited_build_setting = key == "CARGO_TARGET_DIR"
            || key == "CARGO_BUILD_TARGET"
            || key == "CARGO_ENCODED_RUSTFLAGS"
            || key == "RUSTFLAGS"
            || key == "CARGO_BUILD_RUSTFLAGS"
            || (key.starts_with("CARGO_PROFILE_") && !key.starts_with("CARGO_PROFILE_GUEST_"))
            || key.starts_with("CARGO_FEATURE_")
            || key.starts_with("CARGO_CFG_");
        if inherited_build_setting {
            command.env_remove(key);
        }
    }
    command
}

/// Adds the wasm32-wasip2 standard library when missing, so a newcomer's first build needs no
/// manual step. `rustup target add` is idempotent and only downloads the target's std for the
/// installed toolchain (unlike `rustup update`, which would replace the toolchain).
fn ensure_wasm_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let libdir = Command::new(&rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if libdir.is_some_and(|dir| dir.exists()) {
        return;
    }
    println!("cargo:warning=installing the {TARGET} target with rustup");
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .expect("rustup is needed to add the wasm32-wasip2 target");
    assert!(status.success(), "`rustup target add {TARGET}` failed");
}
