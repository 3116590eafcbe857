package kafka_batch_peers;

import java.sql.Timestamp;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.streaming.kafka010.KafkaUtils;
import org.apache.spark.streaming.kafka010.LocationStrategies;
import org.apache.spark.streaming.kafka010.OffsetRange;

/**
 * The original KafkaRDD for a PySpark job: {@code KafkaUtils.createRDD} over fixed offset ranges, its
 * ConsumerRecords as rows with the Kafka source's columns, so that the job decodes and aggregates them
 * as DataFrames. Called through py4j (scripts/bench/peers/spark_peer.py, mode rdd).
 */
public final class KafkaRddRows {
    private static final StructType SCHEMA = new StructType()
            .add("topic", DataTypes.StringType)
            .add("partition", DataTypes.IntegerType)
            .add("offset", DataTypes.LongType)
            .add("timestamp", DataTypes.TimestampType)
            .add("key", DataTypes.BinaryType)
            .add("value", DataTypes.BinaryType);

    private KafkaRddRows() {
    }

    /** The records of the ranges (topics[i], partitions[i], starts[i], untils[i]) as rows. */
    public static Dataset<Row> rows(SparkSession spark, Map<String, Object> params, List<String> topics,
                                   List<Number> partitions, List<Number> starts, List<Number> untils) {
        OffsetRange[] ranges = new OffsetRange[topics.size()];
        for (int i = 0; i < ranges.length; i++) {
            ranges[i] = OffsetRange.create(topics.get(i), partitions.get(i).intValue(), starts.get(i).longValue(),
                    untils.get(i).longValue());
        }
        Map<String, Object> kafka = new HashMap<>(params);
        kafka.put("key.deserializer", ByteArrayDeserializer.class);
        kafka.put("value.deserializer", ByteArrayDeserializer.class);
        JavaRDD<ConsumerRecord<byte[], byte[]>> records = KafkaUtils.createRDD(
                JavaSparkContext.fromSparkContext(spark.sparkContext()), kafka, ranges,
                LocationStrategies.PreferConsistent());
        JavaRDD<Row> rows = records.map(r -> RowFactory.create(r.topic(), r.partition(), r.offset(),
                new Timestamp(r.timestamp()), r.key(), r.value()));
        return spark.createDataFrame(rows, SCHEMA);
    }
}
