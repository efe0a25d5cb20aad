//! Computes next fires in a loop, for profiling.
fn main() {
    let expr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "0 */5 * * * *".into());
    let s = dagcron_cron::Schedule::parse(&expr).unwrap();
    let mut n = 0i64;
    for i in 0..20_000_000i64 {
        let t = jiff::Timestamp::from_second(1_767_225_600 + (i % 64) * 492_113).unwrap();
        n += s.next_after(std::hint::black_box(t)).unwrap().as_second() & 1;
    }
    println!("{n}");
}
