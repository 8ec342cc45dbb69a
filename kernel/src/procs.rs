//! Process-tree queries from /proc, so shutdown can wait until a cell process's workers are gone.

/// Live (non-zombie) processes whose parent is `pid`, and their descendants.
pub fn descendants(pid: u32) -> Vec<u32> {
    let table = snapshot();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, parent, zombie) in &table {
            if parent == p && !zombie && !out.contains(&child) {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

/// (pid, ppid, is_zombie) for every process.
fn snapshot() -> Vec<(u32, u32, bool)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name may contain spaces and parentheses: fields follow the last ')'.
            let rest = &stat[stat.rfind(')')? + 1..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            Some((pid, ppid, state == "Z"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_grandchild() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let found = loop {
            let d = descendants(me);
            if d.len() >= 2 || std::time::Instant::now() > deadline {
                break d;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let sh = child.id();
        let sleep_pids = descendants(sh);
        let _ = std::process::Command::new("kill")
            .args(sleep_pids.iter().map(|p| p.to_string()))
            .status();
        let _ = child.wait();
        assert!(found.contains(&sh), "{found:?}");
        assert_eq!(sleep_pids.len(), 1, "{sleep_pids:?}");
    }
}
