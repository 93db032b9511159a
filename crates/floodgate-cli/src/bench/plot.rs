//! `--plot FILE.svg`: throughput against threads, one line per contender.
//!
//! Drawn with plotters' SVG backend and no font feature (the default one needs the
//! system's fontconfig): labels are SVG `<text>` elements the viewer renders.

use std::path::Path;

use plotters::prelude::*;

/// One line: a contender's name and its (threads, million decisions per second) points.
pub(crate) type Series = (&'static str, Vec<(usize, f64)>);

/// Turns rows of (threads, [(contender, rate)]) into one series per contender, in the
/// order contenders first appear, each sorted by threads.
pub(crate) fn series<I>(rows: I) -> Vec<Series>
where
    I: IntoIterator<Item = (usize, Vec<(&'static str, f64)>)>,
{
    let mut out: Vec<Series> = Vec::new();
    for (threads, cells) in rows {
        for (name, rate) in cells {
            match out.iter_mut().find(|(n, _)| *n == name) {
                Some((_, points)) => points.push((threads, rate)),
                None => out.push((name, vec![(threads, rate)])),
            }
        }
    }
    for (_, points) in &mut out {
        points.sort_by_key(|&(threads, _)| threads);
    }
    out
}

/// Writes the chart to `path` as SVG.
pub(crate) fn draw(
    path: &Path,
    title: &str,
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    let max_threads = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(t, _)| t))
        .max()
        .unwrap_or(1)
        .max(2);
    let max_rate = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, r)| r))
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1usize..max_threads, 0.0..max_rate)?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc("million decisions per second")
        .draw()?;
    for (index, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_one_sorted_series_per_contender() {
        let s = series([
            (2, vec![("a", 2.0), ("b", 4.0)]),
            (1, vec![("a", 1.0), ("b", 3.0)]),
            (4, vec![("b", 5.0)]),
        ]);
        assert_eq!(
            s,
            vec![
                ("a", vec![(1, 1.0), (2, 2.0)]),
                ("b", vec![(1, 3.0), (2, 4.0), (4, 5.0)])
            ]
        );
    }
}
