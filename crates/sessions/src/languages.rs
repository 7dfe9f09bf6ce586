//! Languages a session or an exec can name, and how their code is run.

use crate::Error;

pub const LANGUAGES: &[&str] = &["bash", "python", "node"];
pub const DEFAULT_LANGUAGE: &str = "bash";
/// Languages an interpreter context runs: a session's, and TypeScript (Node with each cell's
/// types stripped), Java (JShell) and R, which no session language or image of its own stands
/// for.
pub const CONTEXT_LANGUAGES: &[&str] = &["python", "node", "typescript", "bash", "java", "r"];

/// Canonical language name (accepting common aliases), or a 400.
pub fn canonical(name: &str) -> Result<&'static str, Error> {
    Ok(match name {
        "bash" | "sh" | "shell" => "bash",
        "python" | "python3" | "py" => "python",
        "node" | "javascript" | "js" | "nodejs" => "node",
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown language {other:?}; one of {}",
                LANGUAGES.join(", ")
            )))
        }
    })
}

/// Canonical name of a context's language, or a 400.
pub fn context_language(name: &str) -> Result<&'static str, Error> {
    match name {
        "typescript" | "ts" => Ok("typescript"),
        "java" => Ok("java"),
        "r" => Ok("r"),
        other => canonical(other).map_err(|_| {
            Error::InvalidArgument(format!(
                "unknown context language {other:?}; one of {}",
                CONTEXT_LANGUAGES.join(", ")
            ))
        }),
    }
}

/// argv that runs `code` in `language`'s interpreter.
pub fn code_argv(language: &str, code: &str) -> Result<Vec<String>, Error> {
    let (prog, flag) = match canonical(language)? {
        "python" => ("python3", "-c"),
        "node" => ("node", "-e"),
        _ => ("/bin/bash", "-c"),
    };
    Ok(vec![prog.into(), flag.into(), code.into()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_and_unknowns() {
        assert_eq!(canonical("py").unwrap(), "python");
        assert_eq!(canonical("js").unwrap(), "node");
        assert!(matches!(canonical("cobol"), Err(Error::InvalidArgument(_))));
        assert!(canonical("java").is_err(), "no session runs java");
        assert_eq!(context_language("java").unwrap(), "java");
        assert_eq!(context_language("r").unwrap(), "r");
        assert_eq!(context_language("ts").unwrap(), "typescript");
        assert!(canonical("ts").is_err(), "no session runs typescript");
        assert_eq!(context_language("sh").unwrap(), "bash");
        assert!(
            matches!(context_language("cobol"), Err(Error::InvalidArgument(m)) if m.contains("java"))
        );
        assert_eq!(
            code_argv("python", "print(1)").unwrap(),
            ["python3", "-c", "print(1)"]
        );
    }
}
