//! `apm agent` (the release or debug binary, a process of its own) against clients and
//! strangers that would grow it or end it: a client that never reads, a stopped watcher
//! under a flood, two hundred thousand hello asks from strangers, ten thousand connection
//! attempts under a descriptor limit of 1024, a registration listing 1,200 addresses.
//! Each case bounds the agent's resident memory ([`RSS_CEILING`]) and checks that it
//! still serves afterwards. The work of each case is a fixed count, never sized from
//! how fast the machine is.

use apm_agent::access::AgentSocket;
use apm_agent::client::AgentClient;
use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const APM: &str = env!("CARGO_BIN_EXE_apm");

/// The most resident memory the agent may hold in any case (the goal).
const RSS_CEILING_KIB: u64 = 64 << 10;

/// A running `apm agent` on its own port and runtime directory, killed when dropped.
struct AgentProcess {
    child: Child,
    socket: AgentSocket,
    _dir: tempfile::TempDir,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AgentProcess {
    /// `apm agent` on `port`, under `prlimit` when `nofile` is given; up once its
    /// socket answers.
    fn start(port: u16, nofile: Option<u32>) -> AgentProcess {
        let dir = tempfile::tempdir().expect("dir");
        let mut cmd = match nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(APM);
                c
            }
            None => Command::new(APM),
        };
        let child = cmd
            .args(["agent", "--port", &port.to_string(), "--runtime-dir"])
            .arg(dir.path())
            .env("APM_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("apm agent starts");
        let socket = AgentSocket::in_dir(dir.path(), port);
        let agent = AgentProcess {
            child,
            socket,
            _dir: dir,
        };
        for _ in 0..200 {
            if agent.serves() {
                return agent;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("the agent did not come up");
    }

    /// Whether a new client gets an answer to a sync.
    fn serves(&self) -> bool {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
            match AgentClient::connect(&self.socket, tx).await {
                Ok(c) => c.synced().await.is_ok(),
                Err(_) => false,
            }
        })
    }

    /// Its resident memory, KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the agent is alive");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS")
    }

    fn assert_small_and_serving(&mut self, case: &str) {
        assert!(
            self.child.try_wait().expect("wait").is_none(),
            "{case}: the agent died"
        );
        let rss = self.rss_kib();
        assert!(
            rss < RSS_CEILING_KIB,
            "{case}: the agent holds {rss} KiB, over {RSS_CEILING_KIB}"
        );
        assert!(self.serves(), "{case}: the agent no longer serves");
        eprintln!("{case}: the agent holds {} MiB and serves", rss / 1024);
    }
}

fn test_port(salt: u32) -> u16 {
    // Even ports two apart: an agent uses its port and the next.
    (21_000 + ((std::process::id() + salt) % 9_000) * 2) as u16
}

#[test]
fn a_client_that_never_reads_is_dropped_and_the_agent_stays_small() {
    let mut agent = AgentProcess::start(test_port(1), None);
    let mut stream = UnixStream::connect(agent.socket.path()).expect("connect");
    // Two hundred thousand requests, each answered, none of the answers read: the
    // agent drops this client once a quarter MiB of answers waits.
    let mut sent = 0;
    for req in 0..200_000u64 {
        if stream
            .write_all(format!("{{\"op\":\"sync\",\"req\":{req}}}\n").as_bytes())
            .is_err()
        {
            break; // dropped
        }
        sent += 1;
    }
    eprintln!("{sent} requests written before the agent closed the stream");
    agent.assert_small_and_serving("a client that never reads");
}

#[test]
fn a_stopped_watcher_under_a_flood_of_verdicts_is_dropped() {
    let mut agent = AgentProcess::start(test_port(2), None);
    let watcher = Command::new(APM)
        .args([
            "watch",
            "--agent",
            "--agent-port",
            &agent.socket.port().to_string(),
        ])
        .arg("--runtime-dir")
        .arg(agent.socket.dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("apm watch");
    let pid = nix::unistd::Pid::from_raw(watcher.id() as i32);
    let mut watcher = scopeguard(watcher);
    // Attached once it says so on stderr.
    let mut line = String::new();
    let mut err = std::io::BufReader::new(watcher.0.stderr.take().expect("stderr"));
    std::io::BufRead::read_line(&mut err, &mut line).expect("a line");
    assert!(line.contains("attached"), "{line}");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("stop it");
    // An operator's flood: fifty thousand rail-downs, each told to every client. The
    // flooding client reads what it is told; the stopped watcher cannot.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let client = AgentClient::connect(&agent.socket, tx)
            .await
            .expect("client");
        let gid = apm_agent::local::gid_of("10.9.9.9".parse().expect("ip"));
        // In rounds of a thousand, each waited for: the flooder reads its own copies as
        // they come and stays within its budget.
        for _ in 0..50 {
            for _ in 0..1_000 {
                client.rail_down(gid).expect("rail down");
            }
            client.synced().await.expect("the agent handled the round");
        }
        drop(client);
        let _ = drain.await;
    });
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("continue it");
    agent.assert_small_and_serving("a stopped watcher under a flood");
    // The watcher was dropped: it says the agent went away and ends.
    let status = watcher.0.wait().expect("the watch ends");
    assert!(!status.success(), "{status}");
}

/// Kill a child when the case ends however it ends.
struct Guard(Child);
fn scopeguard(c: Child) -> Guard {
    Guard(c)
}
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn two_hundred_thousand_hello_asks_for_new_addresses_leave_it_small() {
    let mut agent = AgentProcess::start(test_port(3), None);
    let hello = format!("127.0.0.1:{}", agent.socket.port() + 1);
    let stranger = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    for i in 0..200_000u32 {
        let [_, b, c, d] = i.to_be_bytes();
        let ask = format!("{{\"apm_hello\":\"ask\",\"gid\":\"::ffff:10.{b}.{c}.{d}\"}}");
        let _ = stranger.send_to(ask.as_bytes(), &hello);
        // Answers come back to the stranger; nobody reads them.
        if i % 1000 == 0 {
            std::thread::yield_now();
        }
    }
    agent.assert_small_and_serving("two hundred thousand hello asks");
}

#[test]
fn ten_thousand_connection_attempts_under_a_descriptor_limit_of_1024() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("skipped: no prlimit (util-linux)");
        return;
    }
    // This test holds its connections open: it needs more descriptors than the agent.
    raise_own_limit();
    let mut agent = AgentProcess::start(test_port(4), Some(1024));
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..10_000 {
        match UnixStream::connect(agent.socket.path()) {
            Ok(s) => held.push(s),
            Err(_) => refused += 1,
        }
    }
    eprintln!(
        "{} connections made ({} refused by the kernel)",
        held.len(),
        refused
    );
    // While they are held: the agent is alive (new clients may be turned away).
    assert!(
        agent.child.try_wait().expect("wait").is_none(),
        "the agent died"
    );
    drop(held);
    // Once they are gone, it serves again.
    let mut served = false;
    for _ in 0..100 {
        if agent.serves() {
            served = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(served, "the agent no longer serves");
    agent.assert_small_and_serving("ten thousand connections under nofile 1024");
}

/// This process's soft descriptor limit to its hard one.
fn raise_own_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

#[test]
fn a_registration_listing_1200_addresses_opens_nothing() {
    let mut agent = AgentProcess::start(test_port(5), None);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let client = AgentClient::connect(&agent.socket, tx)
            .await
            .expect("client");
        let gids: Vec<_> = (0..1200u32)
            .map(|i| {
                let [_, _, c, d] = i.to_be_bytes();
                apm_agent::local::gid_of(format!("10.77.{c}.{d}").parse().expect("ip"))
            })
            .collect();
        client
            .register(apm_agent::wire::Route {
                local_qpn: 5,
                remote_qpn: 6,
                peer_gids: vec![gids[0]],
                local_gids: gids,
                paths: vec![],
                peer_lids: Vec::new(),
            })
            .expect("register");
        client.synced().await.expect("synced");
        let refused = std::iter::from_fn(|| rx.try_recv().ok())
            .any(|m| matches!(m, apm_agent::wire::FromAgent::Refused { .. }));
        assert!(refused, "the registration is refused");
    });
    let fds = std::fs::read_dir(format!("/proc/{}/fd", agent.child.id()))
        .expect("fds")
        .count();
    assert!(fds < 64, "the agent holds {fds} descriptors");
    agent.assert_small_and_serving("a registration of 1,200 addresses");
}
