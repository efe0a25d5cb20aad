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
//! The ranges come from the program's own headers as the loader saw them
//! (`dl_iterate_phdr`), never from a listing of mappings that another
//! thread could change meanwhile: the loadable segments that are not
//! writable, whole pages only, none that overlaps the relocated read-only
//! data (`PT_GNU_RELRO`: read-only, but written by the loader). A program
//! with text relocations (written code or read-only data) gives back
//! nothing. What is dropped is therefore never written: its pages are the
//! file's bytes.

/// A segment of the program, as its header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    kind: u32,
    flags: u32,
    vaddr: u64,
    memsz: u64,
}

const PT_LOAD: u32 = 1;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const PF_W: u32 = 2;

/// Drops this program's clean file pages from its page tables (see the
/// module); answers how many bytes were advised.
pub fn release_program_pages() -> std::io::Result<usize> {
    let Some(program) = program() else {
        return Ok(0);
    };
    // SAFETY: sysconf only reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).unwrap_or(4096);
    let mut released = 0;
    for (start, end) in clean_ranges(&program, page) {
        // SAFETY: `start..end` is whole pages of a loaded segment of this
        // program that nothing writes (see `clean_ranges`): they hold the
        // file's bytes, so dropping them changes no byte this process
        // reads; the next access maps the same page again.
        let rc =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        released += end - start;
    }
    Ok(released)
}

/// The program as loaded: where, its segments, whether it has text
/// relocations.
#[derive(Debug, Default)]
struct Program {
    base: u64,
    segments: Vec<Segment>,
    text_relocations: bool,
}

/// Whole pages of the loadable segments that are not writable and do not
/// overlap the relocated read-only data; none with text relocations.
fn clean_ranges(program: &Program, page: u64) -> Vec<(usize, usize)> {
    if program.text_relocations || page == 0 {
        return vec![];
    }
    let span = |s: &Segment| {
        let start = program.base.checked_add(s.vaddr)?;
        Some((start, start.checked_add(s.memsz)?))
    };
    let relro: Vec<(u64, u64)> = program
        .segments
        .iter()
        .filter(|s| s.kind == PT_GNU_RELRO)
        .filter_map(span)
        .collect();
    program
        .segments
        .iter()
        .filter(|s| s.kind == PT_LOAD && s.flags & PF_W == 0)
        .filter_map(span)
        .filter(|&(start, end)| relro.iter().all(|&(r0, r1)| end <= r0 || r1 <= start))
        .filter_map(|(start, end)| {
            let start = start.div_ceil(page) * page;
            let end = end / page * page;
            (end > start)
                .then(|| Some((usize::try_from(start).ok()?, usize::try_from(end).ok()?)))?
        })
        .collect()
}

/// The program's headers, from the loader.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn program() -> Option<Program> {
    const DT_NULL: u64 = 0;
    const DT_TEXTREL: u64 = 22;
    const DT_FLAGS: u64 = 30;
    const DF_TEXTREL: u64 = 4;
    const PT_DYNAMIC: u32 = 2;

    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader hands each loaded object's description, valid
        // during the call; `data` is the `Program` passed below. The
        // program itself comes first.
        let (info, found) = unsafe { (&*info, &mut *data.cast::<Program>()) };
        // SAFETY: `dlpi_phdr` points at `dlpi_phnum` headers, mapped for
        // the life of the process.
        let headers =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        found.base = info.dlpi_addr;
        for h in headers {
            found.segments.push(Segment {
                kind: h.p_type,
                flags: h.p_flags,
                vaddr: h.p_vaddr,
                memsz: h.p_memsz,
            });
            if h.p_type == PT_DYNAMIC {
                let entries = usize::try_from(h.p_memsz / 16).unwrap_or(0);
                let at = info.dlpi_addr.wrapping_add(h.p_vaddr) as *const [u64; 2];
                // SAFETY: the dynamic section is loaded, `entries` pairs of
                // tag and value long.
                let dynamic = unsafe { std::slice::from_raw_parts(at, entries) };
                for &[tag, value] in dynamic {
                    if tag == DT_NULL {
                        break;
                    }
                    if tag == DT_TEXTREL || (tag == DT_FLAGS && value & DF_TEXTREL != 0) {
                        found.text_relocations = true;
                    }
                }
            }
        }
        1
    }

    let mut found = Program::default();
    // SAFETY: `first` only reads what the loader hands it and writes to
    // `found`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut found).cast()) };
    (!found.segments.is_empty()).then_some(found)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn program() -> Option<Program> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(kind: u32, flags: u32, vaddr: u64, memsz: u64) -> Segment {
        Segment {
            kind,
            flags,
            vaddr,
            memsz,
        }
    }

    /// Read-only and executable segments are taken, whole pages only;
    /// writable ones and any that overlaps the relocated read-only data
    /// are not; a program with text relocations gives back nothing.
    #[test]
    fn only_whole_pages_of_segments_nothing_writes_are_taken() {
        const R: u32 = 4;
        const X: u32 = 1;
        let mut program = Program {
            base: 0x5600_0000_0000,
            segments: vec![
                segment(PT_LOAD, R, 0, 0xc3_b558),
                segment(PT_LOAD, R | X, 0xc3_c580, 0x0261_6b30),
                segment(PT_LOAD, R | PF_W, 0x0325_40b0, 0x14_ff50),
                segment(PT_GNU_RELRO, R, 0x0325_40b0, 0x14_ff50),
                // Read-only but inside the relocated data: never taken.
                segment(PT_LOAD, R, 0x0326_0000, 0x1000),
            ],
            text_relocations: false,
        };
        assert_eq!(
            clean_ranges(&program, 4096),
            [
                (0x5600_0000_0000, 0x5600_00c3_b000),
                (0x5600_00c3_d000, 0x5600_0325_3000),
            ]
        );
        program.text_relocations = true;
        assert!(clean_ranges(&program, 4096).is_empty());
    }

    /// In this test process: the ranges come from the loader, one is
    /// this very code's segment, and after giving them back the code runs on (its
    /// pages come back as used). What it saves is measured by
    /// `scripts/idle-footprint`.
    #[test]
    fn the_program_gives_back_its_code_and_runs_on() {
        let program = program().expect("the program's headers");
        let code = release_program_pages as *const () as usize;
        let ranges = clean_ranges(&program, 4096);
        // Its segment's range, less the partial pages at its ends.
        assert!(
            ranges
                .iter()
                .any(|&(start, end)| start.saturating_sub(4096) <= code && code < end + 4096),
            "{code:#x} not in {ranges:x?}"
        );
        let released = release_program_pages().unwrap();
        assert!(released > 0);
        let text: String = (0..1000).map(|i| format!("{i:x}")).collect();
        assert_eq!(text.len(), 2_728);
    }
}
