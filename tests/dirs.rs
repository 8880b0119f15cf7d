//! Spill directories: private to the user whatever the umask, and a start-up
//! sweep that removes a crashed buffer's leftovers but never a live buffer's
//! directory (of this process, another process, or a process in another PID
//! namespace), another user's, a loosely named one, or anything reached
//! through a symlink.
//!
//! Other processes are this test binary run again on one of the `#[ignore]`d
//! helper tests below, told what to do through environment variables. Tests
//! that need root (another uid, a new PID namespace) say why they skip
//! without it.
#![cfg(unix)]

mod common;

use common::{buffer, value, Buf};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The spill directory the helper process puts its buffer under.
const PARENT_VAR: &str = "SPILLBUFFER_TEST_PARENT";
/// The umask (octal) the helper process sets before building its buffer.
const UMASK_VAR: &str = "SPILLBUFFER_TEST_UMASK";
/// A uid no test file belongs to.
const NOBODY: u32 = 65534;
/// Heavier than the helpers' memory target and than a segment: goes to
/// disk at once, in a file of its own.
const BIG: usize = 100 << 10;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A leftover of a crashed buffer: well named, its lock file not held.
fn leftover(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("lock"), b"").unwrap();
    std::fs::write(dir.join("seg-00000000.spill"), b"spilled bytes").unwrap();
    dir
}

/// Build a buffer in `parent`, which sweeps it, and wait for the sweep.
fn sweep_by_building(parent: &Path) -> Buf {
    let b = buffer(parent, 4096);
    b.flush_blocking().unwrap(); // the sweep is a job on the IO pool
    b
}

/// Spill one big value and read it back: the buffer's directory works.
fn assert_spills(b: &Buf, key: u64) {
    b.insert(key, value(key, BIG)).unwrap();
    b.flush_blocking().unwrap();
    let s = b.stats();
    assert_eq!(s.spill_errors_total, 0, "{s:?}");
    assert!(s.disk_count >= 1, "{s:?}");
    assert_eq!(*b.get(&key).unwrap().unwrap(), value(key, BIG));
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// Another process holding a buffer (see [`child_holding_a_buffer`]).
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// The holder buffer's spill directory.
    dir: PathBuf,
}

impl Holder {
    /// Start the holder under `parent`, through `wrapper` (e.g. `unshare`)
    /// if given, and wait until its buffer is built (its own sweep done)
    /// and has spilled.
    fn start(parent: &Path, wrapper: &[&str], umask: Option<u32>) -> Holder {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args([
            "--exact",
            "child_holding_a_buffer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PARENT_VAR, parent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
        if let Some(m) = umask {
            cmd.env(UMASK_VAR, format!("{m:o}"));
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let dir = loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).unwrap() == 0 {
                panic!(
                    "holder exited before building its buffer: {:?}",
                    child.wait()
                );
            }
            // libtest may have written its "test … " on the same line.
            if let Some((_, d)) = line.trim_end().split_once("spill-dir: ") {
                break PathBuf::from(d);
            }
        };
        Holder {
            child,
            stdin,
            stdout,
            dir,
        }
    }

    /// Let the holder check that its buffer still works, and wait for it
    /// to exit.
    fn finish(mut self) {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        drop(stdin);
        let mut rest = String::new();
        while self.stdout.read_line(&mut rest).unwrap() != 0 {}
        let status = self.child.wait().unwrap();
        assert!(status.success(), "holder failed: {status}\n{rest}");
        assert!(rest.contains("holder: ok"), "{rest}");
    }
}

/// Helper process: build a buffer under `$SPILLBUFFER_TEST_PARENT` (after
/// setting `$SPILLBUFFER_TEST_UMASK`, if given), spill a value, print the
/// spill directory, wait for a line on stdin, then check that the buffer
/// still reads and spills.
#[test]
#[ignore = "a helper process started by the other tests"]
fn child_holding_a_buffer() {
    let parent = std::env::var_os(PARENT_VAR).expect("run by the other tests, not by hand");
    if let Ok(m) = std::env::var(UMASK_VAR) {
        let m = u32::from_str_radix(&m, 8).unwrap();
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(m));
    }
    let b = buffer(Path::new(&parent), 4096);
    assert_spills(&b, 1);
    let dir = b.spill_dirs()[0].clone();
    println!("spill-dir: {}", dir.display());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    // Whatever the others swept, this buffer's directory is whole.
    assert!(dir.join("lock").is_file(), "{}", dir.display());
    assert_eq!(*b.get(&1).unwrap().unwrap(), value(1, BIG));
    assert_spills(&b, 2);
    println!("holder: ok");
}

#[test]
fn spill_files_are_private_whatever_the_umask() {
    for umask in [0o000, 0o022, 0o277] {
        let tmp = tempfile::tempdir().unwrap();
        let holder = Holder::start(tmp.path(), &[], Some(umask));
        assert_eq!(mode(&holder.dir), 0o700, "umask {umask:o}");
        let names = names_in(&holder.dir);
        assert!(names.len() >= 2, "a lock and a segment: {names:?}");
        for name in names {
            let m = mode(&holder.dir.join(&name));
            // The umask may take the owner's bits too (0277 leaves 0400),
            // never add any.
            let expected = 0o600 & !umask;
            assert_eq!(m, expected, "{name} under umask {umask:o}");
        }
        holder.finish();
    }
}

/// Run `cat path` as uid/gid [`NOBODY`]: the bytes, or what cat said.
fn read_as_nobody(path: &Path) -> Result<Vec<u8>, String> {
    let out = Command::new("cat")
        .arg(path)
        .env("LC_ALL", "C") // for the words of its error message
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn another_user_cannot_read_spilled_data() {
    if !is_root() {
        eprintln!("skipped: reading as another user needs root to switch uid");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // A parent anyone may enter, and a file in it anyone may read: the
    // control that shows the other user gets as far as the spill files.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let control = tmp.path().join("public");
    std::fs::write(&control, b"public bytes").unwrap();
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o644)).unwrap();
    if let Err(e) = read_as_nobody(&control) {
        eprintln!("skipped: another user cannot reach the temporary directory: {e}");
        return;
    }

    let b = buffer(tmp.path(), 4096);
    assert_spills(&b, 1);
    let dir = b.spill_dirs()[0].clone();
    let files: Vec<PathBuf> = names_in(&dir).iter().map(|n| dir.join(n)).collect();
    let segment = files
        .iter()
        .find(|f| std::fs::metadata(f).unwrap().len() >= BIG as u64)
        .expect("the spilled value's file");
    for f in &files {
        let err = read_as_nobody(f).unwrap_err();
        assert!(err.contains("Permission denied"), "{}: {err}", f.display());
    }
    // Even with the directory opened to others by hand, each file keeps
    // them out on its own.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let err = read_as_nobody(segment).unwrap_err();
    assert!(err.contains("Permission denied"), "{err}");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(*b.get(&1).unwrap().unwrap(), value(1, BIG));
}

#[test]
fn sweep_removes_only_stale_directories_of_this_user() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("spill");
    std::fs::create_dir(&parent).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"not spill data").unwrap();

    // Stale: must go, whatever pid its name carries (1 always runs).
    let stale = leftover(&parent, "spillbuffer-4000000000-00000000000000a1");
    std::os::unix::fs::symlink(&outside, stale.join("link-out")).unwrap();
    let stale_init = leftover(&parent, "spillbuffer-1-00000000000000a2");

    // Decoys that must stay; those with a segment must keep it.
    let mut kept = Vec::new();
    let mut kept_whole = Vec::new();
    for loose in [
        "spillbuffer-+31995-00000000000000b1",
        "spillbuffer-031995-00000000000000b2",
        "spillbuffer--31995-00000000000000b3",
        "spillbuffer-99999999999-00000000000000b4",
        "spillbuffer-31995-00000000000000B5",
        "spillbuffer-31995-00000000000000b6f",
        "spillbuffer-31995-0000000000000b7",
        "spillbuffer-31995-00000000000000b8.old",
        "xspillbuffer-31995-00000000000000b9",
    ] {
        kept_whole.push(leftover(&parent, loose));
    }
    // A well-named symlink to a stale-looking directory elsewhere.
    let target = leftover(tmp.path(), "spillbuffer-5-00000000000000c1");
    let link = parent.join("spillbuffer-5-00000000000000c2");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    kept.push(link);
    // A well-named plain file.
    let file = parent.join("spillbuffer-6-00000000000000c3");
    std::fs::write(&file, b"x").unwrap();
    kept.push(file);
    // A directory whose lock is a symlink to a lock nobody holds.
    let linked_lock = parent.join("spillbuffer-7-00000000000000c4");
    std::fs::create_dir(&linked_lock).unwrap();
    std::os::unix::fs::symlink(target.join("lock"), linked_lock.join("lock")).unwrap();
    kept.push(linked_lock);
    // A directory with no lock yet (a buffer being created).
    let unlocked = parent.join("spillbuffer-8-00000000000000c5");
    std::fs::create_dir(&unlocked).unwrap();
    kept.push(unlocked);
    // Live although no such pid exists: its lock is held (here, by this
    // test, through its own open file).
    let held = leftover(&parent, "spillbuffer-4000000001-00000000000000c6");
    let held_lock = std::fs::File::open(held.join("lock")).unwrap();
    rustix::fs::flock(&held_lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    kept_whole.push(held);
    // Another user's leftover.
    if is_root() {
        let theirs = leftover(&parent, "spillbuffer-9-00000000000000c7");
        for p in [
            theirs.join("lock"),
            theirs.join("seg-00000000.spill"),
            theirs.clone(),
        ] {
            std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        kept_whole.push(theirs);
    } else {
        eprintln!("skipped the other user's decoy: chown needs root");
    }

    let b = sweep_by_building(&parent);
    assert!(
        !stale.exists() && !stale_init.exists(),
        "{:?}",
        names_in(&parent)
    );
    assert_eq!(
        names_in(&outside),
        ["precious"],
        "no recursion through a symlink"
    );
    for k in &kept {
        assert!(
            std::fs::symlink_metadata(k).is_ok(),
            "{} was removed",
            k.display()
        );
    }
    for k in &kept_whole {
        assert_eq!(
            names_in(k),
            ["lock", "seg-00000000.spill"],
            "{}",
            k.display()
        );
    }
    assert_eq!(names_in(&target), ["lock", "seg-00000000.spill"]);
    // The new buffer's own directory, and nothing else new.
    let expected = kept.len() + kept_whole.len() + 1;
    assert_eq!(names_in(&parent).len(), expected, "{:?}", names_in(&parent));
    assert_spills(&b, 1);
    drop(held_lock);
}

#[test]
fn sweeps_spare_the_live_buffers_of_this_process() {
    let tmp = tempfile::tempdir().unwrap();
    let a = buffer(tmp.path(), 4096);
    assert_spills(&a, 1);
    let b = sweep_by_building(tmp.path());
    let c = sweep_by_building(tmp.path());
    for buf in [&a, &b, &c] {
        assert!(buf.spill_dirs()[0].join("lock").is_file());
    }
    assert_eq!(*a.get(&1).unwrap().unwrap(), value(1, BIG));
    assert_spills(&a, 2);
    assert_spills(&b, 3);
}

#[test]
fn sweeps_spare_a_live_buffer_of_another_process_and_take_it_once_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let holder = Holder::start(tmp.path(), &[], None);
    let dir = holder.dir.clone();
    let b = sweep_by_building(tmp.path());
    assert!(
        dir.join("lock").is_file(),
        "a live holder's directory was swept"
    );
    holder.finish();
    assert!(!dir.exists(), "the holder removes its directory on exit");

    // A holder killed outright leaves its directory; the kernel frees the
    // lock, and the next sweep takes it.
    let mut holder = Holder::start(tmp.path(), &[], None);
    let dir = holder.dir.clone();
    holder.child.kill().unwrap();
    holder.child.wait().unwrap();
    assert!(dir.join("lock").is_file());
    let _c = sweep_by_building(tmp.path());
    assert!(!dir.exists(), "a killed holder's directory stayed");
    assert_spills(&b, 1);
}

/// Can this process start another in a new PID namespace, with its own
/// `/proc` (where this process's pid does not exist)?
fn unshare_works() -> Result<(), String> {
    if !is_root() {
        return Err("a new PID namespace needs root".into());
    }
    match Command::new("unshare").args(UNSHARE).arg("true").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "unshare failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run unshare: {e}")),
    }
}

const UNSHARE: &[&str] = &["--pid", "--fork", "--mount-proc"];

#[test]
fn sweeps_across_pid_namespaces_spare_live_buffers_both_ways() {
    if let Err(why) = unshare_works() {
        eprintln!("skipped: {why}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let here = buffer(tmp.path(), 4096);
    assert_spills(&here, 1);
    let here_dir = here.spill_dirs()[0].clone();
    // Shows the namespaced process does sweep: this one must go.
    let stale = leftover(tmp.path(), "spillbuffer-4000000000-00000000000000a1");

    // In its namespace the holder is pid 1 and this process's pid is not
    // in its /proc: a pid-based sweep there would take this buffer's dir.
    let mut wrapper = vec!["unshare"];
    wrapper.extend_from_slice(UNSHARE);
    let holder = Holder::start(tmp.path(), &wrapper, None);
    assert!(
        holder
            .dir
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("spillbuffer-1-"),
        "{}",
        holder.dir.display()
    );
    assert!(!stale.exists(), "the namespaced buffer's sweep did not run");
    assert!(
        here_dir.join("lock").is_file(),
        "swept from another namespace"
    );
    assert_eq!(*here.get(&1).unwrap().unwrap(), value(1, BIG));
    assert_spills(&here, 2);

    // And the other way: a sweep here spares the namespaced holder's dir.
    let _b = sweep_by_building(tmp.path());
    assert!(
        holder.dir.join("lock").is_file(),
        "swept the namespaced holder's dir"
    );
    let holder_dir = holder.dir.clone();
    holder.finish();
    assert!(!holder_dir.exists());
}
