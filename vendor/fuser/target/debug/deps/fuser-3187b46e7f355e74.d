/work/main/vendor/fuser/target/debug/deps/fuser-3187b46e7f355e74.d: /work/main/clippy.toml src/lib.rs src/access_flags.rs src/bsd_file_flags.rs src/channel.rs src/dev_fuse.rs src/dispatch_gate.rs src/forget_one.rs src/ll/mod.rs src/ll/argument.rs src/ll/flags/mod.rs src/ll/flags/copy_file_range_flags.rs src/ll/flags/cuse_init_flags.rs src/ll/flags/fattr_flags.rs src/ll/flags/fopen_flags.rs src/ll/flags/fsync_flags.rs src/ll/flags/getattr_flags.rs src/ll/flags/init_flags.rs src/ll/flags/ioctl_flags.rs src/ll/flags/poll_flags.rs src/ll/flags/read_flags.rs src/ll/flags/release_flags.rs src/ll/flags/write_flags.rs src/ll/fuse_abi.rs src/ll/ioctl.rs src/ll/ioslice_concat.rs src/ll/notify.rs src/ll/reply.rs src/ll/request.rs src/mnt/mod.rs src/mnt/fuse_pure.rs src/mnt/mount_options.rs src/notify.rs src/open_flags.rs src/passthrough.rs src/poll_events.rs src/read_buf.rs src/rename_flags.rs src/reply.rs src/request.rs src/request_param.rs src/session.rs src/time.rs src/uring/mod.rs src/uring/abi.rs src/uring/entry.rs src/uring/kick.rs src/uring/offload.rs src/uring/queue.rs src/uring/reply.rs src/uring/stats.rs src/uring/sweep.rs Cargo.toml

/work/main/vendor/fuser/target/debug/deps/libfuser-3187b46e7f355e74.rmeta: /work/main/clippy.toml src/lib.rs src/access_flags.rs src/bsd_file_flags.rs src/channel.rs src/dev_fuse.rs src/dispatch_gate.rs src/forget_one.rs src/ll/mod.rs src/ll/argument.rs src/ll/flags/mod.rs src/ll/flags/copy_file_range_flags.rs src/ll/flags/cuse_init_flags.rs src/ll/flags/fattr_flags.rs src/ll/flags/fopen_flags.rs src/ll/flags/fsync_flags.rs src/ll/flags/getattr_flags.rs src/ll/flags/init_flags.rs src/ll/flags/ioctl_flags.rs src/ll/flags/poll_flags.rs src/ll/flags/read_flags.rs src/ll/flags/release_flags.rs src/ll/flags/write_flags.rs src/ll/fuse_abi.rs src/ll/ioctl.rs src/ll/ioslice_concat.rs src/ll/notify.rs src/ll/reply.rs src/ll/request.rs src/mnt/mod.rs src/mnt/fuse_pure.rs src/mnt/mount_options.rs src/notify.rs src/open_flags.rs src/passthrough.rs src/poll_events.rs src/read_buf.rs src/rename_flags.rs src/reply.rs src/request.rs src/request_param.rs src/session.rs src/time.rs src/uring/mod.rs src/uring/abi.rs src/uring/entry.rs src/uring/kick.rs src/uring/offload.rs src/uring/queue.rs src/uring/reply.rs src/uring/stats.rs src/uring/sweep.rs Cargo.toml

/work/main/clippy.toml:
src/lib.rs:
src/access_flags.rs:
src/bsd_file_flags.rs:
src/channel.rs:
src/dev_fuse.rs:
src/dispatch_gate.rs:
src/forget_one.rs:
src/ll/mod.rs:
src/ll/argument.rs:
src/ll/flags/mod.rs:
src/ll/flags/copy_file_range_flags.rs:
src/ll/flags/cuse_init_flags.rs:
src/ll/flags/fattr_flags.rs:
src/ll/flags/fopen_flags.rs:
src/ll/flags/fsync_flags.rs:
src/ll/flags/getattr_flags.rs:
src/ll/flags/init_flags.rs:
src/ll/flags/ioctl_flags.rs:
src/ll/flags/poll_flags.rs:
src/ll/flags/read_flags.rs:
src/ll/flags/release_flags.rs:
src/ll/flags/write_flags.rs:
src/ll/fuse_abi.rs:
src/ll/ioctl.rs:
src/ll/ioslice_concat.rs:
src/ll/notify.rs:
src/ll/reply.rs:
src/ll/request.rs:
src/mnt/mod.rs:
src/mnt/fuse_pure.rs:
src/mnt/mount_options.rs:
src/notify.rs:
src/open_flags.rs:
src/passthrough.rs:
src/poll_events.rs:
src/read_buf.rs:
src/rename_flags.rs:
src/reply.rs:
src/request.rs:
src/request_param.rs:
src/session.rs:
src/time.rs:
src/uring/mod.rs:
src/uring/abi.rs:
src/uring/entry.rs:
src/uring/kick.rs:
src/uring/offload.rs:
src/uring/queue.rs:
src/uring/reply.rs:
src/uring/stats.rs:
src/uring/sweep.rs:
Cargo.toml:

# env-dep:CLIPPY_ARGS=
# env-dep:CLIPPY_CONF_DIR
