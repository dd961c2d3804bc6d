//! SearchTools on a realistic catalog of 300 tools across 10 servers:
//! typical queries should find the tool a careful person would pick.

use std::collections::BTreeMap;

use toolgate::pb;

use crate::common::*;

const TOKEN: &str = "acme-token";

#[derive(serde::Deserialize)]
struct Fixture {
    servers: BTreeMap<String, Vec<serde_json::Value>>,
    queries: Vec<Query>,
}

#[derive(serde::Deserialize)]
struct Query {
    query: String,
    expected: String,
}

#[tokio::test]
async fn ranks_the_right_tool_high_for_typical_queries() {
    let fixture: Fixture =
        serde_json::from_slice(&std::fs::read(fixture("catalog/tools.json")).unwrap()).unwrap();
    let mut servers = Vec::new();
    let mut yaml = format!("tenants:\n  - name: acme\n    tokens: [{TOKEN}]\n    servers:\n");
    for (name, tools) in &fixture.servers {
        let tools: Vec<rmcp::model::Tool> = tools
            .iter()
            .map(|t| {
                rmcp::model::Tool::new(
                    t["name"].as_str().unwrap().to_string(),
                    t["description"].as_str().unwrap().to_string(),
                    std::sync::Arc::new(t["inputSchema"].as_object().unwrap().clone()),
                )
            })
            .collect();
        let server = serve_mcp(TestServer::new(&[]).with_tools(tools)).await;
        yaml.push_str(&format!(
            "      - name: {name}\n        url: \"{}\"\n",
            server.url
        ));
        servers.push(server);
    }
    let gateway = TestGateway::start(&yaml, &[]).await;
    let mut client = gateway.client().await;
    assert_eq!(list(&mut client, TOKEN).await.tools.len(), 300);

    let (mut first, mut top3, mut reciprocal) = (0usize, 0usize, 0f64);
    let mut misses = Vec::new();
    for q in &fixture.queries {
        let response = client
            .search_tools(authed(
                TOKEN,
                pb::SearchToolsRequest {
                    query: q.query.clone(),
                    limit: 100,
                    filter: None,
                },
            ))
            .await
            .unwrap()
            .into_inner();
        let scores: Vec<f64> = response.results.iter().map(|r| r.score).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "ranked best first");
        let rank = response
            .results
            .iter()
            .position(|r| r.tool.as_ref().unwrap().name == q.expected);
        match rank {
            Some(0) => first += 1,
            _ => misses.push(format!(
                "{:?}: expected {} at {:?}, first {}",
                q.query,
                q.expected,
                rank.map(|r| r + 1),
                response
                    .results
                    .first()
                    .map(|r| r.tool.as_ref().unwrap().name.as_str())
                    .unwrap_or("-")
            )),
        }
        if rank.is_some_and(|r| r < 3) {
            top3 += 1;
        }
        reciprocal += rank.map_or(0.0, |r| 1.0 / (r as f64 + 1.0));
    }
    let n = fixture.queries.len() as f64;
    println!(
        "search over 300 tools, {} queries: top-1 {:.0}%, top-3 {:.0}%, MRR {:.2}",
        fixture.queries.len(),
        100.0 * first as f64 / n,
        100.0 * top3 as f64 / n,
        reciprocal / n
    );
    for miss in &misses {
        println!("  miss: {miss}");
    }
    // Filters apply before ranking.
    let only_weather = client
        .search_tools(authed(
            TOKEN,
            pb::SearchToolsRequest {
                query: "forecast".into(),
                limit: 5,
                filter: Some(pb::ListToolsRequest {
                    servers: vec!["weather".into()],
                    ..Default::default()
                }),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!only_weather.results.is_empty() && only_weather.results.len() <= 5);
    assert!(
        only_weather
            .results
            .iter()
            .all(|r| r.tool.as_ref().unwrap().server == "weather")
    );
    // The recorded baseline of lexical ranking (docs/api.md): top-1 55 %,
    // top-3 68 %. The misses are synonyms ("sun go down" for sunset),
    // which no lexical ranker bridges.
    assert!(
        first as f64 / n >= 0.5,
        "top-1 accuracy fell below the recorded baseline"
    );
    assert!(
        top3 as f64 / n >= 0.65,
        "top-3 accuracy fell below the recorded baseline"
    );
    gateway.shutdown().await;
}
