//! Creating and destroying a manager: the configuration read, the runtime chosen
//! (a paused current-thread one for the simulated fabric, two threads for devices), the
//! eventfd and the notification forwarder; and how notifications reach the queue or the
//! callback ([`Delivery`]).

use super::*;

pub(crate) fn create(config_text: &str, out: *mut *mut ApmManager) -> ApmStatus {
    let config = match Config::parse(config_text) {
        Ok(c) => c,
        Err(errors) => {
            let msg: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            return fail(ApmStatus::Config, msg.join("; "));
        }
    };
    let simulated = config
        .devices
        .first()
        .is_some_and(|d| *d.provider.get_ref() == apm::config::ProviderKind::Sim);
    let rt = if simulated {
        // The simulated fabric follows tokio's clock: a paused one plays it on demand.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
    } else {
        // Devices work in real time: apm runs on its own threads between calls.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("apm")
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => return fail(ApmStatus::Io, format!("starting the runtime: {e}")),
    };
    let apm = match rt.block_on(Apm::start(&config)) {
        Ok(a) => a,
        Err(e) => return start_error(e),
    };
    // SAFETY: plain syscall; the fd is owned by `Delivery` and closed in its Drop.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        let _ = rt.block_on(apm.shutdown());
        return fail(
            ApmStatus::Io,
            format!("eventfd: {}", std::io::Error::last_os_error()),
        );
    }
    let delivery = Arc::new(Delivery {
        queue: Mutex::new(VecDeque::new()),
        efd,
        callback: Mutex::new(None),
    });
    let mut notes = apm.notifications();
    let notes = if simulated {
        Some(notes)
    } else {
        let delivery = Arc::clone(&delivery);
        rt.spawn(async move {
            loop {
                match notes.recv().await {
                    Ok(n) => delivery.deliver(vec![c_note(&n)]),
                    Err(broadcast::error::RecvError::Lagged(k)) => tracing_lag(k),
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        None
    };
    let m = Box::new(ApmManager {
        rt,
        apm: Some(apm),
        notes,
        out: delivery,
    });
    // SAFETY: `out` was checked non-NULL by the callers and points to writable storage.
    unsafe { *out = Box::into_raw(m) };
    ApmStatus::Ok
}

/// Create a manager from a deployment configuration file (the TOML `apm config check`
/// validates). On success `*out` holds the manager; destroy it with
/// `apm_manager_destroy`.
///
/// # Safety
/// `config_path` is a NUL-terminated string; `out` points to writable storage for a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn apm_manager_new(
    config_path: *const c_char,
    out: *mut *mut ApmManager,
) -> ApmStatus {
    guard(|| {
        if out.is_null() {
            return fail(ApmStatus::InvalidArgument, "out is NULL");
        }
        // SAFETY: per this function's contract.
        let path = match unsafe { text(config_path, "config_path") } {
            Ok(p) => p,
            Err(s) => return s,
        };
        // Bounded like every reader of apm's input: an endless or huge file costs at
        // most the limit and is refused with it named.
        let limit = apm::input::CONFIG_LIMIT;
        match apm::input::read_file(std::path::Path::new(path), limit, "a configuration file") {
            Ok(t) => create(&t, out),
            Err(e) => fail(ApmStatus::Config, e.to_string()),
        }
    })
}

/// Create a manager from configuration text (the same TOML as a file).
///
/// # Safety
/// As `apm_manager_new`, with `config_toml` the text itself.
#[no_mangle]
pub unsafe extern "C" fn apm_manager_new_from_str(
    config_toml: *const c_char,
    out: *mut *mut ApmManager,
) -> ApmStatus {
    guard(|| {
        if out.is_null() {
            return fail(ApmStatus::InvalidArgument, "out is NULL");
        }
        // SAFETY: per this function's contract.
        match unsafe { text(config_toml, "config_toml") } {
            Ok(t) => create(t, out),
            Err(s) => s,
        }
    })
}

/// Stop the manager (QPs are left as they are) and free it. NULL is ignored.
///
/// # Safety
/// `m` is NULL or a manager from `apm_manager_new*` not destroyed before; it must not
/// be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn apm_manager_destroy(m: *mut ApmManager) {
    let _ = guard(|| {
        if !m.is_null() {
            // SAFETY: created by Box::into_raw in `create`, destroyed once per contract.
            drop(unsafe { Box::from_raw(m) });
        }
        ApmStatus::Ok
    });
}

/// The manager behind a C pointer.
///
/// # Safety
/// `m` is NULL or a live manager, not used concurrently from another thread.
pub(crate) unsafe fn manager<'a>(m: *mut ApmManager) -> Result<&'a mut ApmManager, ApmStatus> {
    // SAFETY: per the caller's contract.
    unsafe { m.as_mut() }.ok_or_else(|| fail(ApmStatus::InvalidArgument, "manager is NULL"))
}

impl ApmManager {
    pub(crate) fn sim_specs(&self) -> Result<Vec<ConnSpec>, ApmStatus> {
        let fabric = self
            .apm
            .as_ref()
            .and_then(|a| a.sim())
            .ok_or_else(|| fail(ApmStatus::Unsupported, "not a simulated deployment"))?;
        let host = fabric.hosts().first().copied().unwrap_or(0);
        // Read between two block_ons: the simulation stays where the runtime left it
        // (provider-sim's `SimProvider` does not read a wall clock outside a runtime).
        Ok(fabric.connections(host))
    }

    /// Simulated deployments: move what the manager published into the queue (or to
    /// the callback). Device deployments forward as notifications come.
    pub(crate) fn collect(&mut self) {
        let Some(notes) = self.notes.as_mut() else {
            return;
        };
        let mut fresh = Vec::new();
        loop {
            match notes.try_recv() {
                Ok(n) => fresh.push(c_note(&n)),
                Err(broadcast::error::TryRecvError::Lagged(k)) => {
                    tracing_lag(k);
                }
                Err(_) => break,
            }
        }
        self.out.deliver(fresh);
    }
}

impl Delivery {
    /// Hand `fresh` to the callback, or queue it and make the fd readable.
    pub(crate) fn deliver(&self, fresh: Vec<ApmNotification>) {
        let callback = *self.callback.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cb, user)) = callback {
            for n in &fresh {
                // SAFETY: the callback and `user` are valid per `apm_set_callback`'s
                // contract; `n` lives across the call.
                unsafe { cb(n, user as *mut c_void) };
            }
            return;
        }
        if fresh.is_empty() {
            return;
        }
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(fresh);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our own eventfd.
        let _ = unsafe { libc::write(self.efd, (&one as *const u64).cast(), 8) };
    }

    /// Reset the eventfd counter (non-blocking read; EAGAIN when already zero).
    pub(crate) fn drain_fd(&self) {
        let mut v: u64 = 0;
        // SAFETY: reading 8 bytes into a live u64 from our own non-blocking eventfd.
        let _ = unsafe { libc::read(self.efd, (&mut v as *mut u64).cast(), 8) };
    }
}
