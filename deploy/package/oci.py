#!/usr/bin/env python3
"""Sluice's OCI image, written without a container engine (Python's standard library only).

    oci.py build --binary PATH --config TOML --version V --out IMAGE.tar [--name REF]
    oci.py unpack IMAGE.tar ROOTFS     # verify every blob, extract the layer; print the config
    oci.py arch BINARY                 # the ELF binary's architecture: amd64, arm64, ...

`build` writes one archive that is both an OCI image layout (oci-layout, index.json,
blobs/sha256/...; what `podman load` and Docker 25+'s `docker load` read) and a docker-archive
(manifest.json, naming the same blobs; what older Dockers read). The image is one gzip'd layer:
the binary at /usr/bin/sluice, the shared libraries it links (ldd; none if it is static) at the
paths ldd names, a default /etc/sluice/sluice.toml, /etc/passwd and /etc/group with the
non-root user sluice (65532:65532, distroless' "nonroot" id), /tmp, and the CA bundle of the
building host if it has one (HTTPS upstreams without `ca` verify against the system's roots).
Every file is root's and not writable by the user; entries, times (SOURCE_DATE_EPOCH, else 0)
and compression are fixed, so the same inputs make the same image digest.

`unpack` is the check's reader: it follows index.json -> manifest -> config and layers,
verifying each blob's size and sha256 and the layer's diff_id, refuses a layer entry that
would land outside ROOTFS, and extracts the layer with its owners and modes.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

UID = GID = 65532
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# ELF e_machine -> the OCI/Go architecture name.
ARCH = {62: "amd64", 183: "arm64", 40: "arm", 243: "riscv64", 21: "ppc64le", 22: "s390x"}
CA_BUNDLES = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"]

PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nsluice:x:65532:65532:sluice:/nonexistent:/sbin/nologin\n"
GROUP = "root:x:0:\nsluice:x:65532:\n"
# glibc resolves names from /etc/hosts first (container runtimes write it), then DNS.
NSSWITCH = "hosts: files dns\n"


def elf_arch(path: Path) -> str:
    head = path.read_bytes()[:20]
    if head[:4] != b"\x7fELF":
        sys.exit(f"{path}: not an ELF binary")
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    if machine not in ARCH:
        sys.exit(f"{path}: unknown ELF machine {machine}")
    return ARCH[machine]


def shared_libraries(binary: Path) -> list[str]:
    """The absolute paths ldd resolves for the binary (its interpreter included); [] if static."""
    out = subprocess.run(["ldd", str(binary)], check=False, capture_output=True, text=True)
    text = out.stdout + out.stderr
    if "not a dynamic executable" in text or "statically linked" in text:
        return []
    if out.returncode != 0:
        sys.exit(f"ldd {binary} failed (another architecture? build it static):\n{text}")
    libs = []
    for line in out.stdout.splitlines():
        if "not found" in line:
            sys.exit(f"ldd {binary}: {line.strip()}")
        m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
        if m:
            libs.append(m.group(1))
    return libs


class Layer:
    """A layer tar with fixed owners, times and order; parents are added before children."""

    def __init__(self, mtime: int):
        self.mtime = mtime
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w", format=tarfile.PAX_FORMAT)
        self.dirs: set[str] = set()

    def _info(self, name: str, kind: bytes, mode: int, uid: int = 0, gid: int = 0) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.uid, info.gid, info.mtime = kind, mode, uid, gid, self.mtime
        info.uname = info.gname = ""
        return info

    def dir(self, path: str, mode: int = 0o755) -> None:
        path = path.strip("/")
        parent = os.path.dirname(path)
        if parent:
            self.dir(parent)
        if path not in self.dirs:
            self.dirs.add(path)
            self.tar.addfile(self._info(path + "/", tarfile.DIRTYPE, mode))

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        path = path.strip("/")
        self.dir(os.path.dirname(path))
        info = self._info(path, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def close(self) -> bytes:
        self.tar.close()
        return self.buf.getvalue()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def build(args: argparse.Namespace) -> None:
    binary = Path(args.binary)
    arch = elf_arch(binary)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))

    layer = Layer(epoch)
    layer.dir("tmp", 0o1777)
    layer.file("etc/passwd", PASSWD.encode())
    layer.file("etc/group", GROUP.encode())
    layer.file("etc/nsswitch.conf", NSSWITCH.encode())
    layer.file("etc/sluice/sluice.toml", Path(args.config).read_bytes())
    for bundle in CA_BUNDLES:
        if os.path.isfile(bundle):
            layer.file("etc/ssl/certs/ca-certificates.crt", Path(bundle).read_bytes())
            break
    for lib in shared_libraries(binary):
        # The file itself (ldd's path may be a symlink) under the name the loader looks for.
        layer.file(lib, Path(os.path.realpath(lib)).read_bytes(), 0o755)
    layer.file("usr/bin/sluice", binary.read_bytes(), 0o755)
    tar = layer.close()

    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, compresslevel=args.level, mtime=0) as f:
        f.write(tar)
    layer_blob = gz.getvalue()

    config = {
        "created": created,
        "architecture": arch,
        "os": "linux",
        "config": {
            "User": f"{UID}:{GID}",
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Entrypoint": ["/usr/bin/sluice"],
            "Cmd": ["run", "-c", "/etc/sluice/sluice.toml"],
            "ExposedPorts": {"8080/tcp": {}},
            "WorkingDir": "/",
            "StopSignal": "SIGTERM",
            "Labels": {
                "org.opencontainers.image.title": "sluice",
                "org.opencontainers.image.description": "Sluice reverse proxy",
                "org.opencontainers.image.version": args.version,
                "org.opencontainers.image.licenses": "Apache-2.0",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]},
        "history": [{"created": created, "created_by": "scripts/package (deploy/package/oci.py)"}],
    }
    config_blob = json.dumps(config, indent=2, sort_keys=True).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": sha256(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": sha256(layer_blob), "size": len(layer_blob)}],
    }
    manifest_blob = json.dumps(manifest, indent=2, sort_keys=True).encode()
    name = args.name or f"ghcr.io/sluice-proxy/sluice:{args.version}"
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": sha256(manifest_blob),
                "size": len(manifest_blob),
                "platform": {"architecture": arch, "os": "linux"},
                # The full name for podman and Docker 25+ (as `docker save` writes it), the tag
                # for OCI tools.
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    blob = lambda data: "blobs/sha256/" + sha256(data).split(":")[1]  # noqa: E731
    docker_manifest = [{"Config": blob(config_blob), "RepoTags": [name], "Layers": [blob(layer_blob)]}]

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    entries = [
        ("blobs/", None),
        ("blobs/sha256/", None),
        (blob(config_blob), config_blob),
        (blob(layer_blob), layer_blob),
        (blob(manifest_blob), manifest_blob),
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, indent=2, sort_keys=True).encode()),
        ("manifest.json", json.dumps(docker_manifest, indent=2).encode()),
    ]
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as archive:
        for path, data in entries:
            info = tarfile.TarInfo(path)
            info.mtime, info.uname, info.gname = epoch, "", ""
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            else:
                info.mode, info.size = 0o644, len(data)
                archive.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    print(f"{out}: {name} ({arch}), {sha256(manifest_blob)}, layer {len(layer_blob) / 1e6:.1f} MB")


def unpack(args: argparse.Namespace) -> None:
    def fail(msg: str) -> None:
        sys.exit(f"{args.image}: {msg}")

    with tarfile.open(args.image) as archive:
        files = {m.name.removeprefix("./"): m for m in archive.getmembers() if m.isfile()}

        def read(name: str) -> bytes:
            if name not in files:
                fail(f"no {name}")
            f = archive.extractfile(files[name])
            assert f is not None
            return f.read()

        def blob(desc: dict, media: str) -> bytes:
            if desc.get("mediaType") != media:
                fail(f"{desc.get('digest')}: media type {desc.get('mediaType')!r}, not {media}")
            algo, _, hexdigest = str(desc.get("digest", "")).partition(":")
            if algo != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexdigest):
                fail(f"bad digest {desc.get('digest')!r}")
            data = read(f"blobs/sha256/{hexdigest}")
            if len(data) != desc.get("size"):
                fail(f"blob {hexdigest}: {len(data)} bytes, the descriptor says {desc.get('size')}")
            if sha256(data) != desc["digest"]:
                fail(f"blob {hexdigest}: its content's sha256 is {sha256(data)}")
            return data

        if json.loads(read("oci-layout")) != {"imageLayoutVersion": "1.0.0"}:
            fail("oci-layout is not version 1.0.0")
        index = json.loads(read("index.json"))
        if index.get("schemaVersion") != 2 or len(index.get("manifests", [])) != 1:
            fail("index.json: want schemaVersion 2 and one manifest")
        manifest = json.loads(blob(index["manifests"][0], MEDIA_MANIFEST))
        config = json.loads(blob(manifest["config"], MEDIA_CONFIG))
        layers = [blob(d, MEDIA_LAYER) for d in manifest["layers"]]
        tars = [gzip.decompress(layer) for layer in layers]
        if config["rootfs"]["diff_ids"] != [sha256(t) for t in tars]:
            fail("config's rootfs.diff_ids do not match the uncompressed layers")

        # The docker-archive index names the same config and layers.
        docker = json.loads(read("manifest.json"))
        want = [f"blobs/sha256/{d['digest'].split(':')[1]}" for d in [manifest["config"]] + manifest["layers"]]
        if [docker[0]["Config"]] + docker[0]["Layers"] != want:
            fail("manifest.json names other blobs than index.json")

    root = Path(args.rootfs)
    root.mkdir(parents=True, exist_ok=True)
    for t in tars:
        with tarfile.open(fileobj=io.BytesIO(t)) as layer:
            for m in layer.getmembers():
                name = os.path.normpath(m.name)
                if name.startswith(("/", "..")) or os.path.basename(name).startswith(".wh."):
                    fail(f"layer entry {m.name!r}: outside the root, or a whiteout")
                dest = root / name
                if m.isdir():
                    dest.mkdir(exist_ok=True)
                elif m.isfile():
                    f = layer.extractfile(m)
                    assert f is not None
                    with open(dest, "wb") as out:
                        shutil.copyfileobj(f, out)
                else:
                    fail(f"layer entry {m.name!r}: only directories and regular files expected")
                os.chown(dest, m.uid, m.gid)
                os.chmod(dest, stat.S_IMODE(m.mode))
    json.dump(config, sys.stdout, indent=2)
    print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--binary", required=True)
    b.add_argument("--config", required=True)
    b.add_argument("--version", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--name", help="image reference (default ghcr.io/sluice-proxy/sluice:VERSION)")
    b.add_argument("--level", type=int, default=6, help="gzip level")
    a = sub.add_parser("arch", help="print the binary's architecture (OCI's name)")
    a.add_argument("binary")
    u = sub.add_parser("unpack")
    u.add_argument("image")
    u.add_argument("rootfs")
    args = p.parse_args()
    if args.cmd == "arch":
        print(elf_arch(Path(args.binary)))
    else:
        build(args) if args.cmd == "build" else unpack(args)


if __name__ == "__main__":
    main()
