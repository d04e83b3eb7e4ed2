//! `cargo xtask image`: the container image the manifests in deploy/ name, written as an
//! OCI archive (see [`oci`]) from this machine's files, without a container daemon or a
//! registry. One layer: `/usr/local/bin/xlb`, the node tools the agent runs (iptables of
//! both backends, nft, ip, ipset, ipvsadm; nsenter and sh for deploy/'s mount-bpffs init
//! container) where this host has them, the shared libraries all of these load (`ldd`),
//! and iptables' xtables modules. Each host path is copied with the symbolic links on its
//! way (`/sbin` → `usr/sbin`, Debian's alternatives), so the image's tree is the host's.

mod oci;

use std::{
    collections::BTreeSet,
    os::unix::fs::PermissionsExt as _,
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use oci::{Node, Reference, RunConfig, Tree};

/// The image deploy/'s DaemonSets run.
pub const DEFAULT_TAG: &str = "ghcr.io/xlb-project/xlb:0.1.0";

/// Where xlb lands in the image (the entrypoint).
const XLB_IN_IMAGE: &str = "/usr/local/bin/xlb";

/// The node tools put in the image where the host has them: kube-proxy's leftovers are
/// found and removed with iptables-save/-restore of both backends and families (the
/// `-nft` and `-legacy` names and the plain ones), nft, ipset, ipvsadm and ip (`xlb agent
/// --takeover-from`, `--shadow`, `xlb cleanup --kube-proxy`, `--hand-back`); nsenter and
/// sh run deploy/'s mount-bpffs init container.
const TOOLS: &[&str] = &[
    "iptables",
    "iptables-save",
    "iptables-restore",
    "ip6tables",
    "ip6tables-save",
    "ip6tables-restore",
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
    "iptables-legacy",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "ip6tables-legacy",
    "ip6tables-legacy-save",
    "ip6tables-legacy-restore",
    "nft",
    "ip",
    "ipset",
    "ipvsadm",
    "nsenter",
    "sh",
];

/// Where the tools are looked for, in order.
const TOOL_DIRS: &[&str] = &["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// Paths the image must have as such: deploy/'s init container runs `/bin/sh`.
const FIXED_PATHS: &[&str] = &["/bin/sh"];

/// How many symbolic links one path may go through.
const MAX_LINKS: usize = 40;

/// Builds the archive of the image `tag` from the release `xlb` at `xlb`; `out` defaults
/// to `xlb-image-TAG.tar` in cargo's target directory.
pub fn run(xlb: &Path, tag: &str, out: Option<PathBuf>) -> Result<()> {
    let reference = Reference::parse(tag)?;
    let out = out.unwrap_or_else(|| {
        crate::build::target_dir().join(format!("xlb-image-{}.tar", reference.tag))
    });
    let mut tree = Tree::new();
    tree.insert(
        XLB_IN_IMAGE.into(),
        Node::File {
            source: xlb.to_path_buf(),
            mode: 0o755,
        },
    );
    let (found, missing) = add_tools(&mut tree)?;
    let modules = add_xtables_modules(&mut tree)?;
    let libraries = add_libraries(&mut tree)?;
    tree.insert("/tmp".into(), Node::Dir { mode: 0o1777 });
    let written = oci::write_archive(
        &tree,
        &run_config(&reference),
        &reference,
        oci::oci_arch(),
        &out,
    )?;
    println!(
        "xtask image: {} ({} bytes), {}, manifest {}",
        out.display(),
        written.archive_bytes,
        reference.full(),
        written.manifest_digest
    );
    println!("  {XLB_IN_IMAGE}; tools: {}", found.join(" "));
    println!("  {libraries} library files and links (ldd), {modules} xtables modules");
    if !missing.is_empty() {
        println!(
            "  not on this host, so not in the image: {} (`cargo xtask setup` installs them)",
            missing.join(" ")
        );
    }
    println!(
        "  load it with `docker load -i {0}`, `podman load -i {0}` or `ctr images import {0}`",
        out.display()
    );
    Ok(())
}

/// The image's run settings: xlb as the entrypoint (the DaemonSets' `command: [xlb, …]`
/// finds it on `PATH`).
fn run_config(reference: &Reference) -> RunConfig {
    let labels = [
        ("org.opencontainers.image.title", "xlb"),
        (
            "org.opencontainers.image.description",
            "xlb: a kube-proxy replacement on eBPF",
        ),
        ("org.opencontainers.image.version", reference.tag.as_str()),
    ];
    RunConfig {
        entrypoint: vec![XLB_IN_IMAGE.into()],
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        labels: labels
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// Adds each of [`TOOLS`] the host has, and [`FIXED_PATHS`]; returns the names found and
/// the names missing.
fn add_tools(tree: &mut Tree) -> Result<(Vec<String>, Vec<String>)> {
    let (mut found, mut missing) = (Vec::new(), Vec::new());
    for name in TOOLS {
        let host = TOOL_DIRS
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.exists());
        match host {
            Some(path) => {
                mirror(tree, &path)?;
                found.push(name.to_string());
            }
            None => missing.push(name.to_string()),
        }
    }
    for path in FIXED_PATHS {
        if Path::new(path).exists() {
            mirror(tree, Path::new(path))?;
        }
    }
    Ok((found, missing))
}

/// Adds iptables' extension modules (`…/xtables/*.so`, which it loads by name at run time)
/// when the image has iptables; returns how many.
fn add_xtables_modules(tree: &mut Tree) -> Result<usize> {
    let has_iptables = tree.keys().any(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("xtables-"))
    });
    if !has_iptables {
        return Ok(0);
    }
    let mut count = 0;
    for dir in xtables_dirs() {
        for entry in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "so") {
                mirror(tree, &path)?;
                count += 1;
            }
        }
    }
    Ok(count)
}

/// The host's xtables module directories (`/usr/lib/x86_64-linux-gnu/xtables`, …).
fn xtables_dirs() -> Vec<PathBuf> {
    let mut dirs = BTreeSet::new();
    for lib in ["/usr/lib", "/usr/lib64", "/lib", "/lib64"] {
        let Ok(entries) = std::fs::read_dir(lib) else {
            continue;
        };
        let candidates = entries
            .filter_map(|e| e.ok().map(|e| e.path().join("xtables")))
            .chain([Path::new(lib).join("xtables")]);
        for dir in candidates {
            if let Ok(real) = dir.canonicalize()
                && real.is_dir()
            {
                dirs.insert(real);
            }
        }
    }
    dirs.into_iter().collect()
}

/// Adds the shared libraries every ELF file of the tree needs (ldd lists them transitively,
/// the dynamic loader included); returns how many files were added.
fn add_libraries(tree: &mut Tree) -> Result<usize> {
    let mut needed = BTreeSet::new();
    for node in tree.values() {
        if let Node::File { source, .. } = node
            && is_elf(source)
        {
            needed.extend(ldd(source)?);
        }
    }
    let before = tree.len();
    for lib in &needed {
        mirror(tree, lib)?;
    }
    Ok(tree.len() - before)
}

/// Whether `path` starts with the ELF magic.
fn is_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// The libraries `ldd` says `binary` loads (none for a static binary).
fn ldd(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot run ldd (Debian's libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() && !text.contains("not a dynamic executable") {
        bail!(
            "ldd {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if text.contains("not found") {
        bail!("ldd {}: a library is missing:\n{text}", binary.display());
    }
    Ok(parse_ldd(&text))
}

/// The absolute paths in ldd's output: `libc.so.6 => /lib/…/libc.so.6 (0x…)` and
/// `/lib64/ld-linux-x86-64.so.2 (0x…)`; `linux-vdso.so.1` has none.
fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            }?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Adds the host's `path` to the tree at the same path: every symbolic link on the way
/// (a directory's, like `/lib64` → `usr/lib64`, or the file's own) becomes the same link
/// in the image, and the file it ends at is copied.
fn mirror(tree: &mut Tree, path: &Path) -> Result<()> {
    let mut pending = normalize(path)?;
    for _ in 0..MAX_LINKS {
        match mirror_step(tree, &pending)? {
            Some(next) => pending = next,
            None => return Ok(()),
        }
    }
    bail!("{}: too many symbolic links", path.display())
}

/// Walks `path` from the root: at the first symbolic link, records it and returns the
/// path it leads to (with the rest of `path` appended); else records the file or
/// directory at the end and returns None.
fn mirror_step(tree: &mut Tree, path: &Path) -> Result<Option<PathBuf>> {
    let parts: Vec<Component> = path.components().skip(1).collect();
    let mut here = PathBuf::from("/");
    for (i, part) in parts.iter().enumerate() {
        here.push(part);
        let meta = std::fs::symlink_metadata(&here).with_context(|| here.display().to_string())?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&here)?;
            tree.insert(here.clone(), Node::Symlink(target.clone()));
            let parent = here.parent().unwrap_or(Path::new("/"));
            let rest: PathBuf = parts[i + 1..].iter().collect();
            return Ok(Some(normalize(&parent.join(target).join(rest))?));
        }
        if i + 1 == parts.len() {
            let mode = meta.permissions().mode() & 0o7777;
            let node = if meta.is_dir() {
                Node::Dir { mode }
            } else {
                Node::File {
                    source: here.clone(),
                    mode,
                }
            };
            tree.insert(here.clone(), node);
        }
    }
    Ok(None)
}

/// `path` made absolute without `.` and `..` (lexically: the parts before it hold no
/// symbolic links, [`mirror_step`] resolved them).
fn normalize(path: &Path) -> Result<PathBuf> {
    if !path.is_absolute() {
        bail!("{}: not an absolute path", path.display());
    }
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_library_paths() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn paths_normalize_lexically() {
        assert_eq!(
            normalize(Path::new("/usr/lib64/../lib/./x")).expect("absolute"),
            PathBuf::from("/usr/lib/x")
        );
        assert!(normalize(Path::new("usr/lib")).is_err());
    }

    #[test]
    fn a_path_is_copied_with_the_links_on_its_way() {
        let dir = std::env::temp_dir().join(format!("xtask-mirror-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("real/bin")).expect("dirs");
        std::fs::write(dir.join("real/bin/multi"), b"x").expect("file");
        std::os::unix::fs::symlink("real/bin", dir.join("bin")).expect("dir link");
        std::os::unix::fs::symlink("multi", dir.join("real/bin/tool")).expect("file link");
        let mut tree = Tree::new();
        let result = mirror(&mut tree, &dir.join("bin/tool"));
        let _ = std::fs::remove_dir_all(&dir);
        result.expect("mirrored");
        assert_eq!(
            tree.get(&dir.join("bin")),
            Some(&Node::Symlink("real/bin".into()))
        );
        assert_eq!(
            tree.get(&dir.join("real/bin/tool")),
            Some(&Node::Symlink("multi".into()))
        );
        assert!(matches!(
            tree.get(&dir.join("real/bin/multi")),
            Some(Node::File { .. })
        ));
    }
}
