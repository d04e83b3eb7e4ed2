//! The image as an OCI image-layout tar archive, written without a container daemon or a
//! registry: `oci-layout`, `index.json` and `blobs/sha256/…` (one gzip layer, its config,
//! its manifest), with Docker's `manifest.json` and `repositories` beside them so that
//! `docker load` reads it as well as `ctr images import`, `podman load` and skopeo's
//! `oci-archive:`. Deterministic: the same files give the same digests (entries sorted,
//! owned by root, mtime 0, no creation time).

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use flate2::{Compression, write::GzEncoder};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The index annotation OCI tools name the image by (the tag alone, as buildkit writes it).
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The index annotation containerd names the image by (the whole reference).
pub const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// One entry of the image's file tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// A regular file, copied from `source` on the host, with these permission bits.
    File { source: PathBuf, mode: u32 },
    /// A symbolic link to this target.
    Symlink(PathBuf),
    /// A directory with these permission bits.
    Dir { mode: u32 },
}

/// The image's files: absolute path in the image → what is there. Parent directories that
/// are not listed are written as `0755` directories.
pub type Tree = BTreeMap<PathBuf, Node>;

/// An image reference, `ghcr.io/xlb-project/xlb:0.1.0`: its name and its tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub name: String,
    pub tag: String,
}

impl Reference {
    /// Splits `NAME[:TAG]` (the tag defaults to `latest`); a digest reference is refused.
    pub fn parse(reference: &str) -> Result<Self> {
        if reference.contains('@') {
            bail!("{reference}: a digest cannot name an image being written; give NAME:TAG");
        }
        let last = reference.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match reference[last..].rfind(':') {
            Some(i) => (&reference[..last + i], &reference[last + i + 1..]),
            None => (reference, "latest"),
        };
        let tag_ok = tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if name.is_empty() || tag.is_empty() || !tag_ok || tag.len() > 128 {
            bail!("{reference}: not an image reference NAME:TAG");
        }
        Ok(Self {
            name: name.to_string(),
            tag: tag.to_string(),
        })
    }

    /// `NAME:TAG`.
    pub fn full(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }
}

/// The image's run settings (its config's `config` object).
#[derive(Clone, Debug, Default)]
pub struct RunConfig {
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// What [`write_archive`] wrote: the manifest's digest and the archive's size.
#[derive(Debug)]
pub struct Written {
    pub manifest_digest: String,
    pub archive_bytes: u64,
}

/// A content-addressed blob.
struct Blob {
    hex: String,
    bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        Self {
            hex: sha256_hex(&bytes),
            bytes,
        }
    }

    fn digest(&self) -> String {
        format!("sha256:{}", self.hex)
    }

    /// Its path in the archive.
    fn path(&self) -> String {
        format!("blobs/sha256/{}", self.hex)
    }

    /// An OCI descriptor of it.
    fn descriptor(&self, media_type: &str) -> Value {
        json!({"mediaType": media_type, "digest": self.digest(), "size": self.bytes.len()})
    }
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The OCI architecture name of this machine's (`amd64`, `arm64`, …).
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        "x86" => "386",
        other => other,
    }
}

/// Writes the image of `tree` as an archive at `out` (through a temporary file beside it).
pub fn write_archive(
    tree: &Tree,
    run: &RunConfig,
    reference: &Reference,
    arch: &str,
    out: &Path,
) -> Result<Written> {
    let layer_tar = layer(tree)?;
    let diff_id = format!("sha256:{}", sha256_hex(&layer_tar));
    let layer = Blob::new(gzip(&layer_tar)?);
    drop(layer_tar);
    let config = Blob::new(serde_json::to_vec(&config_json(run, arch, &diff_id))?);
    let manifest = Blob::new(serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config.descriptor(CONFIG_MEDIA_TYPE),
        "layers": [layer.descriptor(LAYER_MEDIA_TYPE)],
    }))?);
    let mut index_entry = manifest.descriptor(MANIFEST_MEDIA_TYPE);
    index_entry["annotations"] =
        json!({REF_NAME: reference.tag, CONTAINERD_NAME: reference.full()});
    index_entry["platform"] = json!({"architecture": arch, "os": "linux"});
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [index_entry],
    });
    let docker_manifest = json!([{
        "Config": config.path(),
        "RepoTags": [reference.full()],
        "Layers": [layer.path()],
    }]);
    let repositories = json!({reference.name.clone(): {reference.tag.clone(): config.hex}});
    let files: [(&str, Vec<u8>); 4] = [
        ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        ("index.json", serde_json::to_vec(&index)?),
        ("manifest.json", serde_json::to_vec(&docker_manifest)?),
        ("repositories", serde_json::to_vec(&repositories)?),
    ];
    write_outer(out, &files, &[&layer, &config, &manifest])?;
    Ok(Written {
        manifest_digest: manifest.digest(),
        archive_bytes: std::fs::metadata(out)?.len(),
    })
}

/// The image config: run settings, the one layer's uncompressed digest, one history entry
/// (Docker counts history entries against layers).
fn config_json(run: &RunConfig, arch: &str, diff_id: &str) -> Value {
    json!({
        "architecture": arch,
        "os": "linux",
        "config": {
            "Entrypoint": run.entrypoint,
            "Env": run.env,
            "Labels": run.labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "cargo xtask image"}],
    })
}

/// The outer archive: the layout's files, `blobs/sha256/`, then every blob.
fn write_outer(out: &Path, files: &[(&str, Vec<u8>)], blobs: &[&Blob]) -> Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    }
    let tmp = out.with_extension("tmp");
    let file = File::create(&tmp).with_context(|| tmp.display().to_string())?;
    let mut tar = tar::Builder::new(BufWriter::new(file));
    for (name, bytes) in files {
        append_file(&mut tar, Path::new(name), 0o644, bytes)?;
    }
    for dir in ["blobs", "blobs/sha256"] {
        append_dir(&mut tar, Path::new(dir), 0o755)?;
    }
    for blob in blobs {
        append_file(&mut tar, Path::new(&blob.path()), 0o644, &blob.bytes)?;
    }
    tar.into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    std::fs::rename(&tmp, out).with_context(|| format!("{} → {}", tmp.display(), out.display()))
}

/// The uncompressed layer: every node of `tree` and the directories above them, sorted.
fn layer(tree: &Tree) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, node) in with_parents(tree) {
        let rel = path.strip_prefix("/").unwrap_or(&path);
        match node {
            Node::File { source, mode } => {
                let bytes =
                    std::fs::read(source).with_context(|| format!("{}", source.display()))?;
                append_file(&mut tar, rel, *mode, &bytes)?;
            }
            Node::Symlink(target) => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                tar.append_link(&mut h, rel, target)
                    .with_context(|| format!("{} → {}", path.display(), target.display()))?;
            }
            Node::Dir { mode } => append_dir(&mut tar, rel, *mode)?,
        }
    }
    Ok(tar.into_inner()?)
}

/// `tree` with the directories above its entries added (`0755`), in path order (a parent
/// before its children).
fn with_parents(tree: &Tree) -> BTreeMap<PathBuf, &Node> {
    const PARENT: Node = Node::Dir { mode: 0o755 };
    let mut all: BTreeMap<PathBuf, &Node> = tree.iter().map(|(p, n)| (p.clone(), n)).collect();
    for path in tree.keys() {
        for parent in path.ancestors().skip(1) {
            if parent != Path::new("/") && !parent.as_os_str().is_empty() {
                all.entry(parent.to_path_buf()).or_insert(&PARENT);
            }
        }
    }
    all
}

/// A header owned by root with mtime 0.
fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

fn append_file<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    path: &Path,
    mode: u32,
    bytes: &[u8],
) -> Result<()> {
    let mut h = header(tar::EntryType::Regular, mode, bytes.len() as u64);
    tar.append_data(&mut h, path, bytes)
        .with_context(|| path.display().to_string())
}

fn append_dir<W: std::io::Write>(tar: &mut tar::Builder<W>, path: &Path, mode: u32) -> Result<()> {
    let mut h = header(tar::EntryType::Directory, mode, 0);
    tar.append_data(&mut h, path, std::io::empty())
        .with_context(|| path.display().to_string())
}

/// `bytes` gzipped.
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(bytes)?;
    Ok(gz.finish()?)
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, io::Read as _};

    use super::*;

    /// A scratch directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("scratch dir");
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A tar archive's entries: path → (kind, mode, contents, link target).
    type Entries = BTreeMap<String, (tar::EntryType, u32, Vec<u8>, Option<String>)>;

    /// Every entry of a tar archive.
    fn entries(bytes: &[u8]) -> Entries {
        let mut out = BTreeMap::new();
        for e in tar::Archive::new(bytes).entries().expect("a tar") {
            let mut e = e.expect("an entry");
            let path = e.path().expect("a path").display().to_string();
            let kind = e.header().entry_type();
            let mode = e.header().mode().expect("a mode");
            let link = e
                .link_name()
                .expect("a link name")
                .map(|l| l.display().to_string());
            let mut data = Vec::new();
            e.read_to_end(&mut data).expect("contents");
            out.insert(path, (kind, mode, data, link));
        }
        out
    }

    fn json_of(files: &Entries, name: &str) -> Value {
        serde_json::from_slice(&files.get(name).unwrap_or_else(|| panic!("no {name}")).2)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// The blob a descriptor names, its size and media type checked.
    fn blob<'a>(files: &'a Entries, desc: &Value, media_type: &str) -> &'a [u8] {
        assert_eq!(desc["mediaType"], media_type);
        let digest = desc["digest"].as_str().expect("a digest");
        let hex = digest.strip_prefix("sha256:").expect("sha256");
        let bytes = &files
            .get(&format!("blobs/sha256/{hex}"))
            .unwrap_or_else(|| panic!("no blob {digest}"))
            .2;
        assert_eq!(desc["size"].as_u64(), Some(bytes.len() as u64), "{digest}");
        bytes
    }

    #[test]
    fn references_split_into_name_and_tag() {
        let r = Reference::parse("ghcr.io/xlb-project/xlb:0.1.0").expect("a reference");
        assert_eq!(
            (r.name.as_str(), r.tag.as_str()),
            ("ghcr.io/xlb-project/xlb", "0.1.0")
        );
        let r = Reference::parse("localhost:5000/xlb").expect("a reference");
        assert_eq!(
            (r.name.as_str(), r.tag.as_str()),
            ("localhost:5000/xlb", "latest")
        );
        assert!(Reference::parse("xlb@sha256:00").is_err());
        assert!(Reference::parse("xlb:").is_err());
        assert!(Reference::parse("xlb:bad tag").is_err());
    }

    #[test]
    fn the_archive_is_consistent_and_every_blob_matches_its_digest() {
        let scratch = Scratch::new("oci-test");
        let source = scratch.0.join("xlb");
        std::fs::write(&source, b"#!/bin/true\nnot really xlb\n").expect("write");
        let mut tree = Tree::new();
        tree.insert(
            "/usr/local/bin/xlb".into(),
            Node::File {
                source: source.clone(),
                mode: 0o755,
            },
        );
        tree.insert("/bin".into(), Node::Symlink("usr/bin".into()));
        tree.insert("/tmp".into(), Node::Dir { mode: 0o1777 });
        let run = RunConfig {
            entrypoint: vec!["/usr/local/bin/xlb".into()],
            env: vec!["PATH=/usr/local/bin:/usr/bin".into()],
            labels: BTreeMap::new(),
        };
        let reference = Reference::parse("ghcr.io/xlb-project/xlb:0.1.0").expect("reference");
        let out = scratch.0.join("out/image.tar");
        let written = write_archive(&tree, &run, &reference, "amd64", &out).expect("written");
        let outer = entries(&std::fs::read(&out).expect("the archive"));
        assert_eq!(
            written.archive_bytes,
            std::fs::metadata(&out).expect("size").len()
        );

        // Every blob is named by its content's digest.
        let blobs: Vec<_> = outer
            .keys()
            .filter(|k| k.starts_with("blobs/sha256/") && k.len() > 13)
            .collect();
        assert_eq!(blobs.len(), 3, "layer, config, manifest: {blobs:?}");
        for name in blobs {
            let hex = name.trim_start_matches("blobs/sha256/");
            assert_eq!(sha256_hex(&outer[name].2), hex, "{name}");
        }

        // oci-layout, index.json → manifest → config and layer.
        assert_eq!(json_of(&outer, "oci-layout")["imageLayoutVersion"], "1.0.0");
        let index = json_of(&outer, "index.json");
        assert_eq!(index["schemaVersion"], 2);
        assert_eq!(index["mediaType"], INDEX_MEDIA_TYPE);
        let entry = &index["manifests"][0];
        assert_eq!(index["manifests"].as_array().map(Vec::len), Some(1));
        assert_eq!(entry["annotations"][REF_NAME], "0.1.0");
        assert_eq!(
            entry["annotations"][CONTAINERD_NAME],
            "ghcr.io/xlb-project/xlb:0.1.0"
        );
        assert_eq!(entry["digest"], written.manifest_digest.as_str());
        let manifest: Value =
            serde_json::from_slice(blob(&outer, entry, MANIFEST_MEDIA_TYPE)).expect("manifest");
        assert_eq!(manifest["schemaVersion"], 2);
        let config: Value =
            serde_json::from_slice(blob(&outer, &manifest["config"], CONFIG_MEDIA_TYPE))
                .expect("config");
        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1);
        let gz = blob(&outer, &layers[0], LAYER_MEDIA_TYPE);
        let mut layer_tar = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut layer_tar)
            .expect("a gzip layer");
        assert_eq!(
            config["rootfs"]["diff_ids"],
            json!([format!("sha256:{}", sha256_hex(&layer_tar))])
        );
        assert_eq!(
            config["config"]["Entrypoint"],
            json!(["/usr/local/bin/xlb"])
        );
        assert_eq!(config["architecture"], "amd64");
        assert_eq!(config["os"], "linux");

        // Docker's view of the same blobs.
        let docker = json_of(&outer, "manifest.json");
        let docker = &docker[0];
        assert_eq!(docker["RepoTags"], json!(["ghcr.io/xlb-project/xlb:0.1.0"]));
        assert_eq!(
            docker["Config"],
            format!(
                "blobs/sha256/{}",
                manifest["config"]["digest"]
                    .as_str()
                    .expect("digest")
                    .trim_start_matches("sha256:")
            )
        );
        assert_eq!(
            docker["Layers"],
            json!([format!(
                "blobs/sha256/{}",
                layers[0]["digest"]
                    .as_str()
                    .expect("digest")
                    .trim_start_matches("sha256:")
            )])
        );
        let repositories = json_of(&outer, "repositories");
        assert!(repositories["ghcr.io/xlb-project/xlb"]["0.1.0"].is_string());

        // The layer: the file with its mode, its parents, the link, root-owned and sorted.
        let layer = entries(&layer_tar);
        let (kind, mode, data, _) = &layer["usr/local/bin/xlb"];
        assert_eq!((*kind, *mode), (tar::EntryType::Regular, 0o755));
        assert_eq!(data, &std::fs::read(&source).expect("source"));
        for dir in ["usr", "usr/local", "usr/local/bin"] {
            assert_eq!(layer[dir].0, tar::EntryType::Directory, "{dir}");
        }
        assert_eq!(layer["bin"].3.as_deref(), Some("usr/bin"));
        assert_eq!(layer["tmp"].1, 0o1777);

        // The same tree gives the same archive.
        let again = scratch.0.join("again.tar");
        let second = write_archive(&tree, &run, &reference, "amd64", &again).expect("again");
        assert_eq!(second.manifest_digest, written.manifest_digest);
    }
}
