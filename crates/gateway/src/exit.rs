//! How `toolgate` exits: one code for each kind of answer, chosen here and nowhere else, so a
//! script (or CI) can tell "the answer is no" from "the command could not run". Defined in this
//! crate, not the CLI's, because the worker process it runs exits through it too.

use std::process::ExitCode;

/// The exit status of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// It ran, and the answer is yes: clean, allowed, verified, applied, done.
    Success = 0,
    /// It ran, and the answer is no: lint findings, a denied call, a refused approval or
    /// reload, a broken chain, drift from the lockfile, an audit at or above `--fail-on`.
    Refused = 1,
    /// It could not run: a usage error, an unreadable registry, an unreachable or missing
    /// store, an upstream that did not answer.
    Failure = 2,
    /// `decide`: the call would wait for a person's approval.
    NeedsApproval = 3,
    /// Stopped at once by a second SIGINT or SIGTERM, as if the process died (128 + SIGINT, as
    /// shells report an interrupted command).
    Interrupted = 130,
}

impl Exit {
    /// [`Exit::Refused`] when `refused`, else [`Exit::Success`].
    pub fn refused_if(refused: bool) -> Exit {
        if refused {
            Exit::Refused
        } else {
            Exit::Success
        }
    }

    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_scripts_rely_on() {
        assert_eq!(Exit::Success.code(), 0);
        assert_eq!(Exit::Refused.code(), 1);
        assert_eq!(Exit::Failure.code(), 2);
        assert_eq!(Exit::NeedsApproval.code(), 3);
        assert_eq!(Exit::Interrupted.code(), 130);
        assert_eq!(Exit::refused_if(true), Exit::Refused);
        assert_eq!(Exit::refused_if(false), Exit::Success);
    }
}
