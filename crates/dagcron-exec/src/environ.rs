//! Forgetting the secrets this process was started with.
//!
//! A variable removed with `std::env::remove_var` still shows in
//! `/proc/<pid>/environ`, which reads the memory the process was started
//! with. [`forget`] overwrites the values there too, so that a process
//! that can read the server's `/proc` entry (its own user's, outside the
//! sandbox) finds nothing either.

/// Blanks the values of `names` in this process's environment, the memory
/// behind `/proc/self/environ` included, then removes them. Call it before
/// any other thread starts (the environment is not safe to change while
/// another thread reads it).
pub fn forget(names: &[&str]) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: single-threaded (the caller's promise); each entry of
    // `environ` is a NUL-terminated string of this process's, and only the
    // bytes of its value, before that NUL, are written.
    unsafe {
        let mut entry = libc::environ;
        while !entry.is_null() && !(*entry).is_null() {
            let text = std::ffi::CStr::from_ptr(*entry).to_bytes();
            if let Some(eq) = text.iter().position(|b| *b == b'=') {
                if names.iter().any(|n| n.as_bytes() == &text[..eq]) {
                    let value = (*entry).add(eq + 1);
                    std::ptr::write_bytes(value, b'*', text.len() - eq - 1);
                }
            }
            entry = entry.add(1);
        }
        for name in names {
            std::env::remove_var(name);
        }
    }
}
