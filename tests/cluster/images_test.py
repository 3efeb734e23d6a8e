#!/usr/bin/env python3
"""scripts/images builds the project's images exactly as the Dockerfile's final stages lay them out.

    python3 tests/cluster/images_test.py        (cargo test runs it: tests/tests/it/images_layout.rs)

The Dockerfile's stages `webhook`, `device-plugin` and `certgen` are read here on their own (a few
regular expressions, independently of scripts/images); then `scripts/images build --only
webhook,device-plugin,certgen` runs with stand-in binaries, a stand-in preload library and a tiny
fake Debian rootfs (so neither cargo, debootstrap nor gcc is needed), and every OCI archive it
writes is read back: the image configuration's User, Entrypoint, Cmd and ExposedPorts must be the
Dockerfile's, every file the Dockerfile COPYs must be in the layers at its path, mode 0755 (binaries)
or 0644 (the library), owned 0:0, with the source's content; digests, diff_ids, times and the
distroless-like base are checked too. Finally an instruction scripts/images does not interpret,
inserted into a copy of the Dockerfile, must make it fail and name the instruction and the stage.
The workload image (where the node tests open SSH, sudo, cron and login sessions) is built from a
fake rootfs too: the user `other` added, pam_loginuid optional, no SSH host keys, and a missing
session tool named. Standard library only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "images"
DOCKERFILE = ROOT / "Dockerfile"
STAGES = {
    "webhook": "localhost/hami-limits/hami-webhook:test",
    "device-plugin": "localhost/hami-limits/hami-device-plugin:test",
    "certgen": "localhost/hami-limits/hami-certgen:test",
}
BINARIES = ("hami-webhook", "hami-device-plugin", "hami-certgen", "hami-limits")
EPOCH = 1_700_000_000


def dockerfile_stages(text: str) -> dict[str, dict]:
    """The three final stages: copies (destination -> (source stage, source path)), user,
    entrypoint, cmd, exposed ports."""
    joined = re.sub(r"\\\n", " ", "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#")))
    stages: dict[str, dict] = {}
    for match in re.finditer(r"^FROM\s+(\S+)\s+AS\s+(\S+)\s*\n(.*?)(?=^FROM\s|\Z)", joined, re.M | re.S):
        base, name, body = match.groups()
        if name not in STAGES:
            continue
        stage = {"base": base, "copies": {}, "user": None, "entrypoint": None, "cmd": None, "ports": set()}
        for copy in re.finditer(r"^COPY\s+--from=(\S+)\s+(.+)$", body, re.M):
            *sources, dest = copy.group(2).split()
            for source in sources:
                path = dest + source.rsplit("/", 1)[1] if dest.endswith("/") else dest
                stage["copies"][path] = (copy.group(1), source)
        if user := re.search(r"^USER\s+(\S+)\s*$", body, re.M):
            stage["user"] = user.group(1)
        if entrypoint := re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", body, re.M):
            stage["entrypoint"] = json.loads(entrypoint.group(1))
        if cmd := re.search(r"^CMD\s+(\[.*\])\s*$", body, re.M):
            stage["cmd"] = json.loads(cmd.group(1))
        for expose in re.finditer(r"^EXPOSE\s+(.+)$", body, re.M):
            stage["ports"] |= {p if "/" in p else p + "/tcp" for p in expose.group(1).split()}
        stages[name] = stage
    return stages


def fake_rootfs(path: Path) -> None:
    """A merged-/usr Debian-like rootfs with dpkg lists for libc6 and libgcc-s1, and a shell that
    the base must leave out."""
    libc6 = "/.\n/lib\n/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu/libc.so.6\n/lib64\n/lib64/ld-linux-x86-64.so.2\n"
    libc6 += "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2\n/etc\n/etc/ld.so.conf.d\n"
    libc6 += "/etc/ld.so.conf.d/x86_64-linux-gnu.conf\n"
    libgcc = "/.\n/lib\n/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu/libgcc_s.so.1\n/usr/share/doc/libgcc-s1\n"
    entries = [
        ("etc", "dir", None), ("etc/ld.so.conf.d", "dir", None),
        ("etc/ld.so.conf.d/x86_64-linux-gnu.conf", "file", b"/usr/lib/x86_64-linux-gnu\n"),
        ("etc/os-release", "sym", "../usr/lib/os-release"), ("etc/passwd", "file", b"root:x:0:0::/root:/bin/sh\n"),
        ("lib", "sym", "usr/lib"), ("lib64", "sym", "usr/lib64"), ("bin", "sym", "usr/bin"),
        ("usr", "dir", None), ("usr/bin", "dir", None), ("usr/bin/sh", "file", b"#!fake shell\n"),
        ("usr/lib", "dir", None), ("usr/lib/os-release", "file", b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n'),
        ("usr/lib/x86_64-linux-gnu", "dir", None),
        ("usr/lib/x86_64-linux-gnu/libc.so.6", "file", b"fake libc"),
        ("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "file", b"fake ld.so"),
        ("usr/lib/x86_64-linux-gnu/libgcc_s.so.1", "file", b"fake libgcc_s"),
        ("usr/lib64", "dir", None),
        ("usr/lib64/ld-linux-x86-64.so.2", "sym", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        ("usr/share", "dir", None), ("usr/share/doc", "dir", None), ("usr/share/doc/libgcc-s1", "dir", None),
        ("var", "dir", None), ("var/lib", "dir", None), ("var/lib/dpkg", "dir", None),
        ("var/lib/dpkg/info", "dir", None),
        ("var/lib/dpkg/info/libc6:amd64.list", "file", libc6.encode()),
        ("var/lib/dpkg/info/libc6:amd64.conffiles", "file", b"/etc/ld.so.conf.d/x86_64-linux-gnu.conf\n"),
        ("var/lib/dpkg/info/libgcc-s1:amd64.list", "file", libgcc.encode()),
    ]
    with tarfile.open(path, "w") as tar:
        for name, kind, value in entries:
            info = tarfile.TarInfo("./" + name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, value
                tar.addfile(info)
            else:
                info.size, info.mode = len(value), 0o644
                tar.addfile(info, io.BytesIO(value))


class Archive:
    """An OCI image archive: its index, manifest, config and the merged layers."""

    def __init__(self, path: Path):
        with tarfile.open(path) as tar:
            self.names = tar.getnames()
            self.blobs = {}
            for member in tar.getmembers():
                if member.isfile():
                    self.blobs[member.name] = tar.extractfile(member).read()  # type: ignore[union-attr]
        self.index = json.loads(self.blobs["index.json"])
        self.layout = json.loads(self.blobs["oci-layout"])
        self.manifest = json.loads(self.blob(self.index["manifests"][0]["digest"]))
        self.config = json.loads(self.blob(self.manifest["config"]["digest"]))
        self.files: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
        self.layer_diff_ids = []
        self.layer_entries: list[list[tarfile.TarInfo]] = []
        for layer in self.manifest["layers"]:
            data = self.blob(layer["digest"])
            if layer["mediaType"].endswith("+gzip"):
                data = gzip.decompress(data)
            self.layer_diff_ids.append("sha256:" + hashlib.sha256(data).hexdigest())
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                members = tar.getmembers()
                self.layer_entries.append(members)
                for member in members:
                    content = tar.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
                    self.files["/" + member.name.strip("/")] = (member, content)

    def blob(self, digest: str) -> bytes:
        data = self.blobs["blobs/sha256/" + digest.split(":", 1)[1]]
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise AssertionError(f"blob {digest} does not match its digest")
        return data


class ImagesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="images-test.")
        tmp = Path(cls.tmp.name)
        cls.bin_dir = tmp / "bin"
        cls.bin_dir.mkdir()
        cls.sources = {}
        for binary in BINARIES:
            path = cls.bin_dir / binary
            path.write_bytes(f"#!stand-in for {binary}\n".encode() + os.urandom(64))
            path.chmod(0o600)  # the images' modes come from the Dockerfile's stages, not from here
            cls.sources[f"build:/out/{binary}"] = path
        cls.preload = tmp / "libhami_preload.so"
        cls.preload.write_bytes(b"\x7fELF stand-in preload" + os.urandom(64))
        cls.sources["preload:/out/lib/libhami_preload.so"] = cls.preload
        cls.rootfs = tmp / "rootfs.tar"
        fake_rootfs(cls.rootfs)
        cls.env = {**os.environ, "HAMI_CACHE": str(tmp / "cache"), "SOURCE_DATE_EPOCH": str(EPOCH)}
        cls.out = tmp / "out"
        cls.build(cls.out)
        cls.stages = dockerfile_stages(DOCKERFILE.read_text())
        cls.images = {}
        for line in (cls.out / "images.txt").read_text().splitlines():
            ref, archive = line.split()
            cls.images[ref] = Archive(cls.out / archive)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    @classmethod
    def run_images(cls, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args], env=cls.env, capture_output=True, text=True)

    @classmethod
    def build(cls, out: Path, *extra: str) -> None:
        result = cls.run_images("build", str(out), "--only", ",".join(STAGES), "--bin-dir", str(cls.bin_dir),
                                "--preload", str(cls.preload), "--base-rootfs", str(cls.rootfs), *extra)
        if result.returncode != 0:
            raise AssertionError(f"scripts/images build failed ({result.returncode}):\n{result.stderr}")

    def test_dockerfile_has_the_three_stages(self) -> None:
        self.assertEqual(set(self.stages), set(STAGES))
        for name, stage in self.stages.items():
            self.assertTrue(stage["copies"], name)
            self.assertIn(stage["base"], ("${RUNTIME_IMAGE}", "${RUNTIME_NONROOT_IMAGE}"), name)

    def test_every_image_is_listed_and_named(self) -> None:
        self.assertEqual(set(self.images), set(STAGES.values()))
        for ref, image in self.images.items():
            self.assertEqual(image.layout, {"imageLayoutVersion": "1.0.0"})
            self.assertEqual(len(image.index["manifests"]), 1)
            annotations = image.index["manifests"][0]["annotations"]
            self.assertEqual(annotations["io.containerd.image.name"], ref)
            self.assertEqual(annotations["org.opencontainers.image.ref.name"], "test")
            self.assertEqual((image.config["architecture"], image.config["os"]), ("amd64", "linux"))
            self.assertEqual(image.config["rootfs"]["diff_ids"], image.layer_diff_ids, ref)
            self.assertEqual(len([h for h in image.config["history"] if not h.get("empty_layer")]),
                             len(image.manifest["layers"]), ref)

    def test_config_is_the_dockerfiles(self) -> None:
        for name, ref in STAGES.items():
            stage, config = self.stages[name], self.images[ref].config["config"]
            with self.subTest(stage=name):
                self.assertEqual(config.get("User"), stage["user"])
                self.assertEqual(config.get("Entrypoint"), stage["entrypoint"])
                self.assertEqual(config.get("Cmd"), stage["cmd"])
                self.assertEqual(set(config.get("ExposedPorts") or {}), stage["ports"])
                self.assertIn("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", config["Env"])

    def test_copied_files_are_in_place(self) -> None:
        for name, ref in STAGES.items():
            image = self.images[ref]
            for path, (stage_from, source) in self.stages[name]["copies"].items():
                with self.subTest(stage=name, path=path):
                    self.assertIn(path, image.files)
                    member, content = image.files[path]
                    self.assertTrue(member.isreg(), path)
                    expected_mode = 0o644 if source.endswith(".so") else 0o755
                    self.assertEqual(member.mode & 0o7777, expected_mode, f"{path}: mode {member.mode:o}")
                    self.assertEqual((member.uid, member.gid), (0, 0))
                    self.assertEqual(content, self.sources[f"{stage_from}:{source}"].read_bytes())

    def test_no_other_program_files(self) -> None:
        """The project layers hold the copied files (and their folders) only."""
        for name, ref in STAGES.items():
            image = self.images[ref]
            copied = set(self.stages[name]["copies"])
            for members in image.layer_entries[1:]:
                for member in members:
                    path = "/" + member.name.strip("/")
                    self.assertTrue(path in copied or member.isdir(), f"{name}: unexpected {path}")

    def test_entries_are_normalized(self) -> None:
        for ref, image in self.images.items():
            for members in image.layer_entries:
                names = [m.name for m in members]
                self.assertEqual(names, sorted(names, key=lambda n: n.split("/")), ref)
                for member in members:
                    self.assertEqual(member.mtime, EPOCH, f"{ref}: {member.name}")
                    self.assertEqual((member.uname, member.gname), ("", ""), f"{ref}: {member.name}")

    def test_base_is_distroless_like(self) -> None:
        for name, ref in STAGES.items():
            files = self.images[ref].files
            with self.subTest(stage=name):
                passwd = files["/etc/passwd"][1].decode()  # type: ignore[union-attr]
                self.assertIn("root:x:0:0:root:/root:/sbin/nologin\n", passwd)
                self.assertIn("nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n", passwd)
                self.assertIn("nonroot:x:65532:\n", files["/etc/group"][1].decode())  # type: ignore[union-attr]
                home = files["/home/nonroot"][0]
                self.assertEqual((home.uid, home.gid, home.isdir()), (65532, 65532, True))
                self.assertEqual(files["/tmp"][0].mode & 0o7777, 0o1777)
                self.assertIn("/etc/nsswitch.conf", files)
                self.assertTrue(files["/etc/os-release"][0].isreg())
                self.assertEqual(files["/usr/lib/x86_64-linux-gnu/libc.so.6"][1], b"fake libc")
                self.assertEqual(files["/usr/lib/x86_64-linux-gnu/libgcc_s.so.1"][1], b"fake libgcc_s")
                self.assertEqual(files["/lib"][0].linkname, "usr/lib")
                self.assertTrue(files["/usr/lib64/ld-linux-x86-64.so.2"][0].issym())
                self.assertNotIn("/usr/bin/sh", files)  # not a file of libc6 or libgcc-s1
                self.assertNotIn("/var/lib/dpkg/info/libc6:amd64.list", files)

    def test_plan_agrees_with_the_dockerfile(self) -> None:
        result = self.run_images("plan", "--bin-dir", str(self.bin_dir), "--preload", str(self.preload))
        self.assertEqual(result.returncode, 0, result.stderr)
        plans = {p["stage"]: p for p in json.loads(result.stdout)["images"]}
        for name, stage in self.stages.items():
            with self.subTest(stage=name):
                plan = plans[name]
                self.assertEqual(plan["ref"], STAGES[name])
                self.assertEqual(plan["user"], stage["user"])
                self.assertEqual(plan["entrypoint"], stage["entrypoint"])
                self.assertEqual(plan["cmd"], stage["cmd"])
                self.assertEqual(set(plan["exposed_ports"]), stage["ports"])
                self.assertEqual({f["path"]: f["from"] for f in plan["files"]},
                                 {p: f"{s}:{src}" for p, (s, src) in stage["copies"].items()})

    def test_build_is_reproducible(self) -> None:
        again = Path(self.tmp.name) / "again"
        self.build(again)
        for line in (self.out / "images.txt").read_text().splitlines():
            archive = line.split()[1]
            self.assertEqual((self.out / archive).read_bytes(), (again / archive).read_bytes(), archive)

    def test_unknown_instruction_fails(self) -> None:
        text = DOCKERFILE.read_text()
        for inserted, named in (("RUN true", "RUN"), ("LABEL a=b", "LABEL"),
                                ("COPY --chmod=0700 --from=build /out/hami-webhook /x/", "COPY --chmod=0700")):
            with self.subTest(inserted=inserted):
                changed, count = re.subn(r"^(FROM \S+ AS webhook\n)", rf"\g<1>{inserted}\n", text, flags=re.M)
                self.assertEqual(count, 1, "the Dockerfile's webhook stage was not found")
                dockerfile = Path(self.tmp.name) / "Dockerfile.changed"
                dockerfile.write_text(changed)
                result = self.run_images("build", str(Path(self.tmp.name) / "changed"), "--dockerfile", str(dockerfile),
                                         "--only", ",".join(STAGES), "--bin-dir", str(self.bin_dir),
                                         "--preload", str(self.preload), "--base-rootfs", str(self.rootfs))
                self.assertNotEqual(result.returncode, 0)
                self.assertIn(f"does not handle {named}", result.stderr)
                self.assertIn("in stage webhook", result.stderr)
                self.assertIn("extend it", result.stderr)

    def test_missing_input_names_the_file_and_the_command(self) -> None:
        result = self.run_images("build", str(Path(self.tmp.name) / "missing"), "--only", "device-plugin",
                                 "--bin-dir", str(self.bin_dir), "--preload", str(Path(self.tmp.name) / "nope.so"),
                                 "--base-rootfs", str(self.rootfs))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("nope.so", result.stderr)
        self.assertIn("scripts/build-preload", result.stderr)


WORKLOAD_TOOLS = ("bash", "env", "su", "sleep", "printenv", "cp", "login", "script", "setsid", "nohup", "sudo",
                  "crontab", "ssh-keygen")
PAM_LOGINUID = "session    required     pam_loginuid.so\n"


def fake_workload_rootfs(path: Path, leave_out: str = "") -> None:
    """A Debian-like rootfs with the workload's tools, PAM stacks and users (no `other`), and SSH
    host keys that the image must leave out; `leave_out` is a path not to write."""
    files: dict[str, bytes] = {f"usr/bin/{tool}": f"#!fake {tool}\n".encode() for tool in WORKLOAD_TOOLS}
    files.update({
        "usr/bin/sh": b"#!fake shell\n", "usr/sbin/sshd": b"#!fake sshd\n", "usr/sbin/cron": b"#!fake cron\n",
        "etc/passwd": b"root:x:0:0:root:/root:/bin/bash\n", "etc/group": b"root:x:0:\nshadow:x:42:\n",
        "etc/shadow": b"root:*:19000:0:99999:7:::\n", "etc/gshadow": b"root:*::\n",
        "etc/pam.d/su": b"auth sufficient pam_rootok.so\n", "etc/pam.d/su-l": b"@include su\n",
        "etc/pam.d/sudo": b"@include common-auth\n", "etc/pam.d/sudo-i": b"@include sudo\n",
        "etc/pam.d/sshd": b"account required pam_nologin.so\n" + PAM_LOGINUID.encode(),
        "etc/pam.d/cron": PAM_LOGINUID.encode() + b"session required pam_env.so\n",
        "etc/pam.d/login": PAM_LOGINUID.encode(),
        "etc/ssh/sshd_config": b"Include /etc/ssh/sshd_config.d/*.conf\n",
        "etc/ssh/ssh_host_ed25519_key": b"PRIVATE host key\n", "etc/ssh/ssh_host_ed25519_key.pub": b"ssh-ed25519 AAAA\n",
        "etc/ssh/ssh_host_rsa_key": b"PRIVATE host key\n", "etc/skel/.bashrc": b"# skel\n",
    })
    files.pop(leave_out, None)
    folders = sorted({"/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)})
    with tarfile.open(path, "w") as tar:
        for folder in folders:
            info = tarfile.TarInfo("./" + folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name in ("bin", "sbin"):
            info = tarfile.TarInfo("./" + name)
            info.type, info.linkname = tarfile.SYMTYPE, "usr/" + name
            tar.addfile(info)
        for name, value in sorted(files.items()):
            info = tarfile.TarInfo("./" + name)
            info.size = len(value)
            info.mode = 0o640 if name in ("etc/shadow", "etc/gshadow") else 0o755 if "bin/" in name else 0o644
            info.gid = 42 if name in ("etc/shadow", "etc/gshadow") else 0
            tar.addfile(info, io.BytesIO(value))


class WorkloadTest(unittest.TestCase):
    """The workload image the node's sessions run in: the user `other`, pam_loginuid optional,
    no SSH host keys."""

    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="images-workload-test.")
        self.addCleanup(self.tmp.cleanup)
        self.env = {**os.environ, "HAMI_CACHE": str(Path(self.tmp.name) / "cache"), "SOURCE_DATE_EPOCH": str(EPOCH)}

    def build(self, leave_out: str = "") -> subprocess.CompletedProcess:
        rootfs = Path(self.tmp.name) / "rootfs.tar"
        fake_workload_rootfs(rootfs, leave_out)
        return subprocess.run([sys.executable, str(SCRIPT), "build", str(Path(self.tmp.name) / "out"), "--only",
                               "workload", "--base-rootfs", str(rootfs)], env=self.env, capture_output=True, text=True)

    def test_workload_has_the_sessions_user_and_pam(self) -> None:
        result = self.build()
        self.assertEqual(result.returncode, 0, result.stderr)
        files = Archive(Path(self.tmp.name) / "out" / "workload.tar").files

        def content(path: str) -> str:
            return files[path][1].decode()  # type: ignore[union-attr]

        self.assertEqual(content("/etc/passwd"),
                         "root:x:0:0:root:/root:/bin/bash\nother:x:1000:1000:other:/home/other:/bin/bash\n")
        self.assertTrue(content("/etc/group").endswith("\nother:x:1000:\n"))
        self.assertTrue(content("/etc/shadow").endswith("\nother:*:19000:0:99999:7:::\n"))
        self.assertEqual((files["/etc/shadow"][0].mode & 0o7777, files["/etc/shadow"][0].gid), (0o640, 42))
        self.assertTrue(content("/etc/gshadow").endswith("\nother:!::\n"))
        home = files["/home/other"][0]
        self.assertEqual((home.isdir(), home.uid, home.gid, home.mode & 0o7777), (True, 1000, 1000, 0o755))
        bashrc = files["/home/other/.bashrc"]
        self.assertEqual((bashrc[0].uid, bashrc[0].gid, bashrc[1]), (1000, 1000, b"# skel\n"))
        for pam in ("sshd", "cron", "login"):
            with self.subTest(pam=pam):
                self.assertIn("session    optional     pam_loginuid.so\n", content(f"/etc/pam.d/{pam}"))
                self.assertNotIn("required     pam_loginuid", content(f"/etc/pam.d/{pam}"))
        self.assertEqual([p for p in files if p.startswith("/etc/ssh/ssh_host_")], [])
        self.assertIn("/etc/ssh/sshd_config", files)
        self.assertIn("/usr/sbin/sshd", files)

    def test_a_missing_session_tool_is_named(self) -> None:
        for path, named in (("usr/sbin/sshd", "sshd"), ("usr/bin/crontab", "crontab"),
                            ("etc/pam.d/sudo-i", "/etc/pam.d/sudo-i")):
            with self.subTest(path=path):
                result = self.build(leave_out=path)
                self.assertNotEqual(result.returncode, 0)
                self.assertIn(named, result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
