//! Secrets in printed configuration: a URL's password is masked wherever it
//! is given, in the user info (`postgres://app:pw@db/x`) or as a query
//! parameter (`postgres://db/x?password=pw`).

/// Query parameters whose values are secrets.
const SECRET_PARAMS: &[&str] = &["password", "sslpassword", "pass", "pwd", "token", "auth_token"];

/// A secret query parameter: one of [`SECRET_PARAMS`], or a librdkafka
/// property holding one (`sasl.password`, `ssl.key.password`,
/// `sasl.oauthbearer.client.secret`).
fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS.contains(&name.as_str()) || name.ends_with(".password") || name.ends_with(".secret")
}

/// A URL with every password replaced by `***`, for logs and errors.
pub fn mask_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority_and_path, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    let mut masked = format!("{scheme}://{}", mask_userinfo(authority_and_path));
    if let Some(query) = query {
        masked.push('?');
        masked.push_str(&mask_query(query));
    }
    masked
}

fn mask_userinfo(rest: &str) -> String {
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return rest.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***@{host}"),
        None => rest.to_string(),
    }
}

fn mask_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret(name) => {
                format!("{name}=***")
            }
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            mask_url("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(mask_url("redis://cache:6379"), "redis://cache:6379");
        assert_eq!(mask_url("redis://:pw@cache:6379"), "redis://:***@cache:6379");
    }

    #[test]
    fn passwords_in_the_query_are_masked() {
        assert_eq!(
            mask_url("postgres://app@db/x?sslmode=require&password=s3cret"),
            "postgres://app@db/x?sslmode=require&password=***"
        );
        assert_eq!(
            mask_url("postgres://db/x?PASSWORD=a&application_name=b"),
            "postgres://db/x?PASSWORD=***&application_name=b"
        );
        assert_eq!(mask_url("sqlite://oncegate.db"), "sqlite://oncegate.db");
    }
}
