//! The grant notifiers: one thread per connection that invalidates what the client's
//! kernel caches of a file before a lock granted to it is answered, then answers it.
//!
//! An invalidation (`FUSE_NOTIFY_INVAL_INODE`) waits for the locks of the file's cached
//! pages, which a read waiting for one of the connection's dispatch threads (or its
//! CPU's io_uring queue thread) may hold: so no such thread waits for it, and the
//! grant's answer is sent from here once the invalidation is done. One thread per
//! connection: a connection's invalidation is held up only by that connection's own
//! requests, never another mountpoint's. Within a connection, grants are answered in
//! the order their invalidations were asked for.

use std::sync::mpsc::{self, SendError, Sender};
use std::sync::{Arc, Weak};

use fuser::Notifier;

use crate::locks::GrantAnswer;
use crate::Server;

/// One invalidation to make (node id, on the thread's connection) and what answers its
/// grant after it.
type Job = (u64, GrantAnswer);

/// The notifier threads, one per connection.
pub struct GrantNotify {
    queues: Vec<Sender<Job>>,
}

impl GrantNotify {
    /// Starts one thread per connection (`notifiers[i]` writes to connection `i`); each
    /// ends once this value is dropped.
    pub fn start(notifiers: Vec<Notifier>, srv: Weak<Server>) -> std::io::Result<Arc<GrantNotify>> {
        let notifiers = Arc::new(notifiers);
        let mut queues = Vec::with_capacity(notifiers.len());
        for conn in 0..notifiers.len() {
            let (tx, rx) = mpsc::channel::<Job>();
            let (notifiers, srv) = (notifiers.clone(), srv.clone());
            std::thread::Builder::new()
                .name(format!("vfscalefs-notify-{conn}"))
                .spawn(move || {
                    for (id, answer) in rx {
                        if let Some(srv) = srv.upgrade() {
                            // A bug here must not end the thread: every later grant of the
                            // connection would be answered with no invalidation.
                            let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                srv.grant_coherence(&notifiers, conn, id)
                            }));
                            if made.is_err() {
                                eprintln!("vfscalefs: a cache invalidation of node {id} failed");
                            }
                        }
                        answer();
                    }
                })?;
            queues.push(tx);
        }
        Ok(Arc::new(GrantNotify { queues }))
    }

    /// Invalidates connection `conn`'s caches of node `id`, then runs `answer`, from
    /// the connection's notifier thread.
    pub fn invalidate_then(&self, conn: usize, id: u64, answer: GrantAnswer) {
        match self.queues.get(conn) {
            Some(q) => {
                if let Err(SendError((_, answer))) = q.send((id, answer)) {
                    answer(); // its thread is gone: only at the server's end
                }
            }
            None => answer(), // no such connection: nothing of it is cached
        }
    }
}
