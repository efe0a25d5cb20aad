//! Gives back the pages of this program's own file that start-up mapped.
//!
//! The kernel maps a program's code as it runs, a fault at a time (and
//! the pages around each fault: up to 64 KiB). Start-up runs much code
//! that does not run again (argument parsing, migrations, building the
//! routers and services), and its pages stay counted in the process's
//! resident memory, though they are clean pages of the file, shared with
//! the page cache. An idle server held 14 MiB of them. Dropping them from
//! the process's page tables (`MADV_DONTNEED`) leaves them in the page
//! cache: code that runs again maps its page back in (a minor fault,
//! nothing read from disk).
//!
//! Only mappings of the executable that are not writable and either
//! executable or the start of the file (its headers and read-only data)
//! are dropped: nothing ever writes to them, so their pages are the
//! file's bytes. The relocated read-only data (RELRO) is read-only too,
//! but the loader wrote it: it is neither executable nor at the start of
//! the file (it follows the code), and is left alone.

/// Drops this program's clean file pages from its page tables (see the
/// module); answers how many bytes of mappings were advised.
pub fn release_program_pages() -> std::io::Result<usize> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let exe = exe.to_string_lossy();
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut released = 0;
    for (start, end) in maps
        .lines()
        .filter_map(|line| clean_program_mapping(line, &exe))
    {
        let len = end - start;
        // SAFETY: `start..end` is a whole mapping of this program's file
        // that nothing writes (see `clean_program_mapping`): its pages
        // hold the file's bytes, so dropping them changes no byte this
        // process reads; the next access maps the same page again.
        let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        released += len;
    }
    Ok(released)
}

/// The address range of a line of `/proc/self/maps` if it maps the file
/// `exe` read-only, private, and either executable or from the file's
/// first byte.
fn clean_program_mapping(line: &str, exe: &str) -> Option<(usize, usize)> {
    let mut fields = line.split_ascii_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let path = fields.nth(2)?;
    if path != exe || perms.len() != 4 {
        return None;
    }
    let p = perms.as_bytes();
    let clean = p[0] == b'r' && p[1] == b'-' && p[3] == b'p';
    let at_start = u64::from_str_radix(offset, 16).ok()? == 0;
    if !clean || !(p[2] == b'x' || at_start) {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXE: &str = "/opt/dagcron/bin/dagcron";

    /// The code and the file's start are taken; the relocated read-only
    /// data, the writable data, other files and anonymous memory are not.
    #[test]
    fn only_clean_mappings_of_the_program_are_taken() {
        let maps = [
            (
                "5600a0000000-5600a0c3c000 r--p 00000000 08:01 42 /opt/dagcron/bin/dagcron",
                true,
            ),
            (
                "5600a0c3c000-5600a3253000 r-xp 00c3b000 08:01 42 /opt/dagcron/bin/dagcron",
                true,
            ),
            (
                "5600a3254000-5600a33a4000 r--p 03252000 08:01 42 /opt/dagcron/bin/dagcron",
                false,
            ),
            (
                "5600a33a4000-5600a33b4000 rw-p 033a2000 08:01 42 /opt/dagcron/bin/dagcron",
                false,
            ),
            (
                "7f0000000000-7f0000028000 r--p 00000000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6",
                false,
            ),
            (
                "7f0000028000-7f000019d000 r-xp 00028000 08:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6",
                false,
            ),
            ("7f1000000000-7f1000021000 rw-p 00000000 00:00 0 ", false),
            (
                "7f2000000000-7f2000001000 r-xs 00000000 08:01 42 /opt/dagcron/bin/dagcron",
                false,
            ),
        ];
        for (line, taken) in maps {
            assert_eq!(clean_program_mapping(line, EXE).is_some(), taken, "{line}");
        }
        assert_eq!(
            clean_program_mapping(maps[0].0, EXE),
            Some((0x5600_a000_0000, 0x5600_a0c3_c000))
        );
    }

    /// In a real process: the code and the start of the file are found and
    /// advised, and the program runs on (its pages come back as used).
    /// What it saves is measured by `scripts/idle-footprint`: the pages a
    /// test process maps again just by reading its own maps hide it here.
    #[test]
    fn the_program_gives_back_its_code_and_runs_on() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_string_lossy().into_owned();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let code: usize = maps
            .lines()
            .filter(|l| l.ends_with(exe.as_str()) && l.contains(" r-xp "))
            .filter_map(|l| clean_program_mapping(l, &exe))
            .map(|(start, end)| end - start)
            .sum();
        assert!(code > 0, "no code mapping of {exe} in\n{maps}");
        let released = release_program_pages().unwrap();
        assert!(released > code, "{released} bytes advised, code {code}");
        let text: String = (0..1000).map(|i| format!("{i:x}")).collect();
        assert_eq!(text.len(), 2_728);
    }
}
