//! `obol new connector NAME`: an out-of-tree connector crate that builds and tests on first
//! try — a read tool with an output schema, a write tool with an `Idempotency-Key` binding,
//! harness tests with canned vendor answers, a stand-in vendor and an `obol.toml` serving it.

use std::path::{Path, PathBuf};

use crate::catalog::ConnectorName;

const CARGO_TOML: &str = include_str!("../templates/connector/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("../templates/connector/lib.rs.tmpl");
const COMPONENT_RS: &str = include_str!("../templates/connector/component.rs.tmpl");
const OBOL_TOML: &str = include_str!("../templates/connector/obol.toml.tmpl");
const MOCK_VENDOR: &str = include_str!("../templates/connector/mock_vendor.py.tmpl");

/// Where the new crate takes `obol-sdk` and `obol-harness` from.
#[derive(Debug, Clone)]
pub enum Dependencies {
    /// An Obol checkout on this machine (its `sdk/` crates, by path).
    Checkout(PathBuf),
    /// A git repository holding Obol (the same crates, by git).
    Git(String),
}

impl Dependencies {
    fn spec(&self, package: &str) -> String {
        match self {
            Dependencies::Checkout(root) => {
                format!("{{ path = {:?} }}", root.join("sdk").join(package))
            }
            Dependencies::Git(url) => format!("{{ git = {url:?}, package = {package:?} }}"),
        }
    }
}

/// What `create` wrote.
#[derive(Debug)]
pub struct Created {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
}

/// Writes the crate for connector `name` into `dir` (which must not exist yet).
pub fn create(name: &str, dir: &Path, dependencies: &Dependencies) -> anyhow::Result<Created> {
    let name = ConnectorName::parse(name)
        .map_err(|e| anyhow::anyhow!("{name:?} cannot name a connector: {e}"))?;
    if dir.exists() {
        anyhow::bail!("{} exists; name a new directory", dir.display());
    }
    let crate_name = name.as_str().replace('-', "_");
    let type_name: String = name
        .as_str()
        .split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect();
    // A type name cannot start with a digit.
    let type_name = match type_name.starts_with(|c: char| c.is_ascii_digit()) {
        true => format!("Connector{type_name}"),
        false => type_name,
    };
    let token = format!("obk_{crate_name}_dev");
    let fill = |template: &str| {
        template
            .replace("{{name}}", name.as_str())
            .replace("{{crate}}", &crate_name)
            .replace("{{type}}", &type_name)
            .replace("{{sdk}}", &dependencies.spec("obol-sdk"))
            .replace("{{harness}}", &dependencies.spec("obol-harness"))
            .replace(
                "{{key_hash}}",
                &crate::policy::KeyHash::of_token(&token).to_string(),
            )
    };
    let files = [
        ("Cargo.toml", fill(CARGO_TOML)),
        ("src/lib.rs", fill(LIB_RS)),
        ("tests/component.rs", fill(COMPONENT_RS)),
        ("obol.toml", fill(OBOL_TOML)),
        ("mock_vendor.py", fill(MOCK_VENDOR)),
        (".gitignore", "/target\n*.redb\n*.redb.journal\n".to_owned()),
    ];
    let mut written = Vec::new();
    for (relative, text) in files {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        written.push(path);
    }
    // From a checkout, the versions it was tested with (cargo drops what the crate does not
    // use): the first build reuses what the checkout's build compiled.
    if let Dependencies::Checkout(root) = dependencies
        && std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).is_ok()
    {
        written.push(dir.join("Cargo.lock"));
    }
    Ok(Created {
        dir: dir.to_owned(),
        files: written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scaffold_names_its_connector_everywhere_and_takes_the_sdk_from_where_it_is_told() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("acme-crm");
        let root = PathBuf::from("/opt/obol");
        create("acme-crm", &at, &Dependencies::Checkout(root)).unwrap();
        let cargo = std::fs::read_to_string(at.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("name = \"acme_crm\""), "{cargo}");
        assert!(
            cargo.contains("crate-type = [\"cdylib\", \"rlib\"]"),
            "{cargo}"
        );
        assert!(
            cargo.contains("path = \"/opt/obol/sdk/obol-sdk\""),
            "{cargo}"
        );
        let lib = std::fs::read_to_string(at.join("src/lib.rs")).unwrap();
        assert!(lib.contains("pub struct AcmeCrm;"), "{lib}");
        assert!(lib.contains("Manifest::new(\"acme-crm\""), "{lib}");
        assert!(lib.contains("obol_sdk::export!(AcmeCrm);"), "{lib}");
        let config = std::fs::read_to_string(at.join("obol.toml")).unwrap();
        assert!(
            config.contains("acme_crm.wasm") && config.contains("sha256:"),
            "{config}"
        );
        crate::config::Config::parse(&config, &at).expect("the generated obol.toml is valid");
        // Not over an existing directory, and not for a name no connector may have.
        assert!(create("acme-crm", &at, &Dependencies::Git("x".into())).is_err());
        let other = dir.path().join("other");
        assert!(create("Has.Dot", &other, &Dependencies::Git("x".into())).is_err());
        let git = dir.path().join("git");
        create(
            "acme",
            &git,
            &Dependencies::Git("https://example.invalid/obol".into()),
        )
        .unwrap();
        let cargo = std::fs::read_to_string(git.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("package = \"obol-harness\""), "{cargo}");
    }
}
