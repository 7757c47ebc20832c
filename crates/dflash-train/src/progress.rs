//! A training run's progress on the terminal, and the CPU seconds it has taken.

pub struct Progress {
    pub(crate) bar: indicatif::ProgressBar,
    pub(crate) tty: bool,
    last: std::time::Instant,
}

impl Progress {
    pub fn new(len: u64, what: &str) -> Self {
        use std::io::IsTerminal;
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{what} {{bar:30}} {{pos}}/{{len}} {{elapsed}} eta {{eta}} {{msg}}"
            ))
            .expect("template"),
        );
        Progress {
            bar,
            tty: std::io::stderr().is_terminal(),
            last: std::time::Instant::now(),
        }
    }
    pub fn bar(&self) -> &indicatif::ProgressBar {
        &self.bar
    }
    /// Updates the bar; without a terminal, prints a line every 30 s instead.
    pub fn update(&mut self, pos: u64, msg: String) {
        self.bar.set_position(pos);
        if !self.tty && self.last.elapsed().as_secs() >= 30 {
            eprintln!("{pos}/{} {msg}", self.bar.length().unwrap_or(0));
            self.last = std::time::Instant::now();
        }
        self.bar.set_message(msg);
    }
    pub fn finish(&self) {
        self.bar.finish();
    }
}

pub(crate) fn cpu_seconds() -> f64 {
    // utime + stime of this process, from /proc (Linux); 0 elsewhere.
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let f: Vec<&str> = s
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let tick = 100.0;
    let p = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (p(11) + p(12)) / tick
}
