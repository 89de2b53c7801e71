//! The CLI contract, end to end, against the real binary.

use std::collections::HashMap;

use crate::common::{Env, gen_sample, unbase64};

#[test]
fn ingest_list_and_query_an_image_folder() {
    let env = Env::new();
    let src = env.path("pets");
    gen_sample(&env, &src, 3, 8, 7);
    std::fs::write(src.join("class_1/notes.txt"), "not an image").unwrap();
    std::fs::write(src.join("class_2/empty.jpg"), "").unwrap();
    std::os::unix::fs::symlink(env.path("nowhere.jpg"), src.join("class_2/dangling.jpg")).unwrap();

    let out = env.ok(&["ingest", "pets", src.to_str().unwrap()]);
    assert!(
        out.contains("ingested 'pets' version 1: 24 samples"),
        "{out}"
    );
    assert!(out.contains("skipped 3:"), "{out}");
    assert!(
        out.contains("class_2/dangling.jpg: a symbolic link (links are not followed)"),
        "{out}"
    );
    assert!(
        out.contains("class_1/notes.txt: not a recognised image, video or array format"),
        "{out}"
    );
    assert!(out.contains("class_2/empty.jpg: empty file"), "{out}");

    let list = env.json(&["datasets", "--format", "json"]);
    assert_eq!(list[0]["name"], "pets");
    assert_eq!(list[0]["latest_version"], 1);
    assert_eq!(list[0]["samples"], 24);
    let table = env.ok(&["datasets"]);
    assert!(table.lines().nth(1).unwrap().starts_with("pets"), "{table}");

    let rows = env.sql_json(
        "SELECT label, count(*) AS n FROM pets GROUP BY label ORDER BY label",
        &[],
    );
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["label"], "class_0");
    assert_eq!(rows[0]["n"], 8);

    // Binary columns print as their length by default, as bytes when asked.
    let rows = env.sql_json("SELECT key, data, length FROM pets ORDER BY key", &[]);
    assert_eq!(rows.len(), 24);
    assert_eq!(rows[0]["data"], rows[0]["length"]);
    let rows = env.sql_json(
        "SELECT key, data FROM pets ORDER BY key",
        &["--binary", "base64"],
    );
    for r in &rows {
        let key = r["key"].as_str().unwrap();
        let original = std::fs::read(src.join(key)).unwrap();
        assert_eq!(
            unbase64(r["data"].as_str().unwrap()),
            original,
            "bytes of {key}"
        );
    }

    let csv = env.ok(&[
        "sql",
        "SELECT key, width FROM pets ORDER BY key LIMIT 2",
        "--format",
        "csv",
    ]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "key,width");
    assert_eq!(lines.len(), 3);
    let table = env.ok(&[
        "sql",
        "SELECT format, count(*) FROM pets GROUP BY format ORDER BY format",
    ]);
    assert!(
        table.contains("| jpeg") && table.contains("| png"),
        "{table}"
    );

    // Sniffed dimensions match the files.
    let rows = env.sql_json("SELECT key, width, height, channels FROM pets", &[]);
    for r in rows {
        let key = r["key"].as_str().unwrap();
        let (w, h) = image::image_dimensions(src.join(key)).unwrap();
        assert_eq!(
            (r["width"].as_u64().unwrap(), r["height"].as_u64().unwrap()),
            (u64::from(w), u64::from(h))
        );
        assert_eq!(r["channels"], 3);
    }
}

#[test]
fn on_error_fail_commits_nothing() {
    let env = Env::new();
    let src = env.path("src");
    gen_sample(&env, &src, 1, 4, 1);
    env.ok(&["ingest", "ds", src.to_str().unwrap()]);
    std::fs::write(
        src.join("class_0/zz_broken.jpg"),
        b"\xff\xd8\xff\xe0 truncated",
    )
    .unwrap();
    let err = env.fails(&["ingest", "ds", src.to_str().unwrap(), "--on-error", "fail"]);
    assert!(
        err.contains("sample 'class_0/zz_broken.jpg' refused"),
        "{err}"
    );
    assert!(err.contains("nothing was committed"), "{err}");
    let list = env.json(&["datasets", "--format", "json"]);
    assert_eq!(list[0]["latest_version"], 1);
    assert_eq!(list[0]["versions"].as_array().unwrap().len(), 1);
}

#[test]
fn manifests_carry_their_columns() {
    let env = Env::new();
    let src = env.path("imgs");
    gen_sample(&env, &src, 2, 5, 3);
    let mut csv = String::from("path,key,label,split\n");
    let mut want = HashMap::new();
    for c in 0..2 {
        for i in 0..5 {
            let path = format!(
                "class_{c}/img_{i:05}.{}",
                if i % 4 == 3 { "png" } else { "jpg" }
            );
            let split = if i == 0 { "val" } else { "train" };
            csv.push_str(&format!("{path},sample-{c}-{i},{c},{split}\n"));
            want.insert(format!("sample-{c}-{i}"), path);
        }
    }
    let manifest = env.path("manifest.csv");
    std::fs::write(&manifest, csv).unwrap();
    let out = env.ok(&[
        "ingest",
        "m",
        src.to_str().unwrap(),
        "--manifest",
        manifest.to_str().unwrap(),
    ]);
    assert!(out.contains("10 samples"), "{out}");
    let rows = env.sql_json(
        "SELECT key, label, data FROM m WHERE split = 'val' ORDER BY key",
        &["--binary", "base64"],
    );
    assert_eq!(rows.len(), 2);
    for r in rows {
        let key = r["key"].as_str().unwrap();
        assert_eq!(
            unbase64(r["data"].as_str().unwrap()),
            std::fs::read(src.join(&want[key])).unwrap()
        );
    }
    // A manifest that names a missing file skips it by default, naming it.
    std::fs::write(
        &manifest,
        "path\nclass_0/img_00000.jpg\nclass_0/missing.jpg\n",
    )
    .unwrap();
    let out = env.ok(&[
        "ingest",
        "m2",
        src.to_str().unwrap(),
        "--manifest",
        manifest.to_str().unwrap(),
    ]);
    assert!(out.contains("class_0/missing.jpg: cannot read"), "{out}");
}

#[test]
fn bad_requests_get_one_line_errors() {
    let env = Env::new();
    let src = env.path("src");
    gen_sample(&env, &src, 1, 2, 1);
    env.ok(&["ingest", "ds", src.to_str().unwrap()]);

    let err = env.fails(&["sql", "SELECT * FROM missing_ds"]);
    assert!(
        err.contains("missing_ds") && err.contains("not found"),
        "{err}"
    );
    let err = env.fails(&["sql", "SELECT bogus FROM ds"]);
    assert!(err.contains("bogus"), "{err}");
    let err = env.fails(&["sql", "SELEC oops"]);
    assert!(
        err.contains("SQL error") || err.contains("Expected"),
        "{err}"
    );
    let err = env.fails(&[
        "sql",
        "CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '/etc/passwd'",
    ]);
    assert!(err.contains("DDL not supported"), "{err}");
    let err = env.fails(&["sql", "COPY (SELECT 1) TO '/tmp/x.csv'"]);
    assert!(err.contains("not supported"), "{err}");
    let err = env.fails(&["ingest", "ds", env.path("nope").to_str().unwrap()]);
    assert!(err.contains("nope"), "{err}");
    let err = env.fails(&["ingest", "bad name", src.to_str().unwrap()]);
    assert!(err.contains("invalid dataset name 'bad name'"), "{err}");
    let err = env.fails(&["sql", "SELECT 1", "--format", "xml"]);
    assert!(err.contains("xml"), "{err}");
}

#[test]
fn an_incompatible_data_dir_is_a_clear_error() {
    let env = Env::new();
    env.ok(&["info"]);
    let fmt = env.data_dir().join("FORMAT");
    let text = std::fs::read_to_string(&fmt)
        .unwrap()
        .replace("\"format_version\": 1", "\"format_version\": 7");
    std::fs::write(&fmt, text).unwrap();
    let err = env.fails(&["datasets"]);
    assert!(
        err.contains("written in format version 7, this sluice reads version 1"),
        "{err}"
    );
}

#[test]
fn info_reports_the_device_and_free_space() {
    let env = Env::new();
    let doc = env.json(&["info", "--format", "json"]);
    assert_eq!(doc["space"]["chunk_size"], 1 << 20);
    assert_eq!(doc["space"]["total_chunks"], 256);
    assert_eq!(doc["space"]["free_chunks"], 256);
    let backend = doc["device"]["backend"].as_str().unwrap();
    assert!(backend == "uring" || backend == "file", "{backend}");
    let doc = env.json(&["--device-backend", "file", "info", "--format", "json"]);
    assert_eq!(doc["device"]["backend"], "file");
}
